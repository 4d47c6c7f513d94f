package bucket

import (
	"crypto/sha256"
	"encoding/binary"
	"hash/maphash"
)

// SumKey returns the shared key of a bucket's material (the canonical
// encoding package descriptors builds): the first 16 bytes of its SHA-256.
// Every node computes the same key, as buckets in Redis need.
//
// Why SHA-256 and not a fast hash: clients choose the values. With a
// non-cryptographic hash an attacker could compute values whose key
// collides with someone else's bucket and drain it; finding a collision of
// even 128 bits of SHA-256 is out of reach.
func SumKey(material []byte) Key {
	sum := sha256.Sum256(material)
	var k Key
	copy(k[:], sum[:len(k)])
	return k
}

// NodeHasher derives keys for buckets that never leave this process (a
// Limiter whose Shared is false). It is two independently seeded
// hash/maphash sums, some ten times faster than SHA-256. That is safe
// against chosen values because the seeds are random per process and never
// leave it: without them, nobody can aim a value at another's bucket;
// accidental collisions of 128 bits do not happen. Keys differ between
// processes, so never send them to a shared store.
type NodeHasher struct {
	lo, hi maphash.Seed
}

// NewNodeHasher returns a NodeHasher with fresh random seeds.
func NewNodeHasher() NodeHasher {
	return NodeHasher{lo: maphash.MakeSeed(), hi: maphash.MakeSeed()}
}

// Sum returns the node-local key of a bucket's material.
func (h NodeHasher) Sum(material []byte) Key {
	var k Key
	binary.LittleEndian.PutUint64(k[:8], maphash.Bytes(h.lo, material))
	binary.LittleEndian.PutUint64(k[8:], maphash.Bytes(h.hi, material))
	return k
}
