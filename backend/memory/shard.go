package memory

import (
	"encoding/binary"
	"math/bits"
	"sync"

	"github.com/sluice-rls/sluice/descriptors"
)

const (
	// maxShards bounds the shard count so that the set of shards one call
	// locks fits in a uint64 bitmask. 64 mutexes make contention between
	// unrelated keys rare at any core count we run on, and with uniformly
	// spread keys a call of n hits locks about n of them whatever the count,
	// so more shards cost nothing per call (see BenchmarkShards).
	maxShards = 64

	// minShardBuckets is the smallest per-shard capacity New aims for: a
	// small MaxBuckets gets fewer shards rather than shards of one or two
	// buckets, which would evict long before the limiter is full.
	minShardBuckets = 64

	// evictSample is how many buckets an insert into a full shard inspects
	// to choose a victim.
	evictSample = 8

	// evictScanDivisor sets how often an insert into a full shard walks the
	// whole shard for full buckets: once per perShard/evictScanDivisor
	// evictions, so each insert pays for about evictScanDivisor buckets of
	// walking.
	evictScanDivisor = 8
)

// shard is one mutex-guarded part of the buckets. A key's shard is fixed by
// its hash, so one mutex serialises all hits on a key.
type shard struct {
	mu        sync.Mutex
	m         map[descriptors.Key]bucket
	evictions int // makeRoom calls since the last full walk, modulo its period
	// Pad to a cache line so neighbouring shards' mutexes do not share one
	// and bounce between cores (false sharing).
	_ [64 - 24]byte
}

// shardLayout returns how many shards (a power of two, at most maxShards)
// hold maxBuckets buckets, and the capacity of each. n×perShard never exceeds
// maxBuckets, so per-shard bounds add up to the global one.
func shardLayout(maxBuckets, want int) (n, perShard int) {
	n = max(1, min(want, maxShards, maxBuckets/minShardBuckets))
	n = 1 << (bits.Len(uint(n)) - 1) // round down to a power of two
	return n, maxBuckets / n
}

// shardIndex maps key to one of 1<<(64-shift) shards. Keys are already
// hashes, but a Fibonacci multiply of both halves costs a nanosecond and
// keeps the spread even for keys that are not, such as tests' Key{1}, Key{2}.
func shardIndex(key *descriptors.Key, shift uint) int {
	x := binary.LittleEndian.Uint64(key[:8]) ^ binary.LittleEndian.Uint64(key[8:])
	return int((x * 0x9e3779b97f4a7c15) >> shift)
}

// store records next as key's bucket. A full bucket is not kept, since it is
// the same as an absent one.
func (s *shard) store(key descriptors.Key, next bucket, now int64) {
	if next.fullAt(now) {
		delete(s.m, key)
		return
	}
	s.m[key] = next
}

// evictFull deletes every bucket full at now and returns how many it
// deleted. The caller holds s.mu.
func (s *shard) evictFull(now int64) int {
	n := 0
	for k, b := range s.m {
		if b.fullAt(now) {
			delete(s.m, k)
			n++
		}
	}
	return n
}

// makeRoom deletes one bucket or more to make room for one. Every
// perShard/evictScanDivisor calls (and on the first) it drops all buckets
// full at now, which costs a walk of the shard but is amortised over the
// inserts between walks. Otherwise, or if none was full, it inspects
// evictSample buckets from a random place in the map and deletes the one
// nearest to full: a full one if sampled, else the one that forgets the
// fewest spent tokens. The caller holds s.mu.
func (s *shard) makeRoom(now int64, perShard int) {
	scan := s.evictions == 0
	s.evictions = (s.evictions + 1) % max(1, perShard/evictScanDivisor)
	if scan && s.evictFull(now) > 0 {
		return
	}
	var (
		victim descriptors.Key
		oldest bucket
		seen   int
	)
	for k, b := range s.m { // Go starts map iteration at a random place
		if seen == 0 || b.tat < oldest.tat || b.tat == oldest.tat && b.frac < oldest.frac {
			victim, oldest = k, b
		}
		if seen++; seen == evictSample {
			break
		}
	}
	if seen > 0 {
		delete(s.m, victim)
	}
}

// shardSet returns the set of shards that hits touch, as a bitmask.
func (l *Limiter) shardSet(hits []descriptors.Hit) uint64 {
	var set uint64
	for i := range hits {
		set |= 1 << shardIndex(&hits[i].Key, l.shift)
	}
	return set
}

// lock locks the shards in set in ascending index order. Every caller that
// holds more than one shard lock takes them in this order, so two calls can
// never wait on each other in a cycle.
func (l *Limiter) lock(set uint64) {
	for s := set; s != 0; s &= s - 1 {
		l.shards[bits.TrailingZeros64(s)].mu.Lock()
	}
}

// unlock unlocks the shards in set.
func (l *Limiter) unlock(set uint64) {
	for s := set; s != 0; s &= s - 1 {
		l.shards[bits.TrailingZeros64(s)].mu.Unlock()
	}
}

// trim evicts buckets from the shards in set until each is within its
// capacity. The caller holds their locks.
func (l *Limiter) trim(set uint64, now int64) {
	for s := set; s != 0; s &= s - 1 {
		sh := &l.shards[bits.TrailingZeros64(s)]
		for len(sh.m) > l.perShard {
			sh.makeRoom(now, l.perShard)
		}
	}
}
