package redis

// routing says how hits are split into script calls.
type routing int

const (
	routeOne  routing = iota // one server (or a sentinel master): one call
	routeSlot                // Redis Cluster: one call per master (per slot after a stale slot map)
	routeKey                 // a go-redis Ring shards by hash tag: one call per key
)

// slotCount is the number of Redis Cluster hash slots.
const slotCount = 16384

// anySlot is the slot of a part whose keys may hash to any slot of its
// master: its call names the bucket keys in ARGV (token_bucket.lua).
const anySlot = -1

// slot returns the Redis Cluster hash slot of a key whose hash tag is tag:
// CRC16-CCITT (XMODEM) of the tag, modulo 16384, as the Redis Cluster
// specification defines it. go-redis keeps its implementation in an internal
// package, so this small copy groups hits by slot before the client routes
// them. It runs bit by bit, without a lookup table, to keep package state to
// constants; a 32-byte tag costs 256 shift steps.
func slot(tag []byte) int {
	var crc uint16
	for _, b := range tag {
		crc ^= uint16(b) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % slotCount
}
