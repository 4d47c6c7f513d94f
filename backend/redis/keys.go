package redis

import (
	"strings"

	"github.com/sluice-rls/sluice/bucket"
)

// DefaultPrefix starts every bucket key when Options.Prefix is empty.
const DefaultPrefix = "sluice"

// keyspace is the layout of bucket keys in Redis, "<prefix>:{<hex of the
// bucket's Key>}". The hash is the whole hash tag, so whatever a client
// sends, only the bucket's hash chooses the slot.
type keyspace struct {
	prefix string // braces replaced by '_'
	keyLen int    // of every key: prefix + ":{" + 32 hex digits + "}"
}

// newKeyspace returns the keyspace of prefix (DefaultPrefix when empty).
// Braces in it become '_', so that only the bucket's hash can be a Redis
// Cluster hash tag.
func newKeyspace(prefix string) keyspace {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	prefix = strings.NewReplacer("{", "_", "}", "_").Replace(prefix)
	return keyspace{prefix: prefix, keyLen: len(prefix) + len(":{}") + 2*len(bucket.Key{})}
}

// appendKey appends the Redis key of bucket k.
func (ks keyspace) appendKey(b []byte, k bucket.Key) []byte {
	const hexDigits = "0123456789abcdef"
	b = append(b, ks.prefix...)
	b = append(b, ":{"...)
	for _, c := range k {
		b = append(b, hexDigits[c>>4], hexDigits[c&0xf])
	}
	return append(b, '}')
}

// tag returns the hash tag of key, a key of ks: the hex of its bucket.
func (ks keyspace) tag(key string) string { return key[len(ks.prefix)+2 : len(key)-1] }
