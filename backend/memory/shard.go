package memory

import (
	"encoding/binary"
	"math"
	"math/bits"
	"sync"

	"github.com/sluice-rls/sluice/bucket"
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

	// evictSample is how many buckets an insert into a full shard inspects,
	// looking for a full one to drop, before it considers a walk.
	evictSample = 8

	// evictScanDivisor sets how often an insert into a full shard may walk
	// the whole shard for full buckets: at most once per
	// perShard/evictScanDivisor such inserts, so each pays for about
	// evictScanDivisor buckets of walking however the table is used.
	evictScanDivisor = 8

	// maxShardBuckets bounds a shard's capacity so that a uint32 numbers
	// its slots (and 1 + its last slot, for shard.free).
	maxShardBuckets = math.MaxUint32 - 1
)

// shard is one mutex-guarded part of the buckets. A key's shard is fixed by
// its hash, so one mutex serialises all hits on a key.
//
// The buckets live in a slab, cells, and the map holds each key's slot in
// it, so that a hit on an existing bucket costs one map lookup: the new
// state is written to the slab, not stored in the map again. Only a new
// bucket (an insert) and a bucket leaving (a delete) touch the map twice.
// Neither the map nor the slab holds a pointer, so the garbage collector
// does not scan them. A map of pointers to cells would also update in
// place, but at an allocation per new bucket and a pointer per bucket to
// scan at every collection. Freed slots are chained through their cells
// (free) and reused before the slab grows, so the slab is never longer than
// the most buckets the shard has held at once.
type shard struct {
	mu    sync.Mutex
	m     map[bucket.Key]uint32 // a key's slot in cells
	cells []cell
	// soonest is a lower bound on the TAT of every bucket in m: before it,
	// none is full, so an insert into a full shard is refused without
	// looking. Takes only raise a TAT; store and rollback lower soonest
	// for new buckets and give-backs, and a walk makes it exact.
	soonest int64
	// walkIn counts down the makeRoom calls until one may walk the shard
	// (at 0).
	walkIn int
	// free is 1 + the first free slot of cells (0: none); a free cell's
	// frac holds the next one, likewise.
	free uint32
	// 60 bytes above: pad to a cache line so neighbouring shards' mutexes
	// do not share one and bounce between cores (false sharing).
	_ [64 - 60]byte
}

// shardLayout returns how many shards (a power of two, at most maxShards)
// hold maxBuckets buckets, and the capacity of each. n×perShard never exceeds
// maxBuckets, so per-shard bounds add up to the global one.
func shardLayout(maxBuckets, want int) (n, perShard int) {
	n = max(1, min(want, maxShards, maxBuckets/minShardBuckets))
	n = 1 << (bits.Len(uint(n)) - 1) // round down to a power of two
	return n, int(min(uint64(maxBuckets/n), maxShardBuckets))
}

// shardIndex maps key to one of 1<<(64-shift) shards. Keys are already
// hashes, but a Fibonacci multiply of both halves costs a nanosecond and
// keeps the spread even for keys that are not, such as tests' Key{1}, Key{2}.
func shardIndex(key *bucket.Key, shift uint) int {
	x := binary.LittleEndian.Uint64(key[:8]) ^ binary.LittleEndian.Uint64(key[8:])
	return int((x * 0x9e3779b97f4a7c15) >> shift)
}

// store records next as the bucket of key, which holds slot, and reports
// whether it kept it: a full bucket is not kept, since it is the same as an
// absent one.
func (s *shard) store(key bucket.Key, slot uint32, next cell, now int64) bool {
	if next.fullAt(now) {
		s.remove(key, slot)
		return false
	}
	s.cells[slot] = next
	s.soonest = min(s.soonest, next.tat)
	return true
}

// put records c as key's bucket, full or not, in the slot key holds or in a
// new one (insert).
func (s *shard) put(key bucket.Key, c cell, perShard int) {
	if slot, ok := s.m[key]; ok {
		s.cells[slot] = c
		s.soonest = min(s.soonest, c.tat)
		return
	}
	s.insert(key, c, perShard)
}

// insert records c as the bucket of key, which has none, in a free slot, or
// a new one when none is free. perShard is the shard's capacity.
func (s *shard) insert(key bucket.Key, c cell, perShard int) {
	var slot uint32
	if s.free != 0 {
		slot = s.free - 1
		s.free = uint32(s.cells[slot].frac)
	} else {
		n := len(s.cells)
		if n == cap(s.cells) {
			// Doubling, but never past perShard: append grows large
			// slices by a quarter, which would copy each cell about four
			// times while the shard fills, and leave slack past its
			// capacity once it is full.
			grown := make([]cell, n, max(n+1, min(max(2*n, 8), perShard)))
			copy(grown, s.cells)
			s.cells = grown
		}
		slot = uint32(n)
		s.cells = append(s.cells, cell{})
	}
	s.m[key] = slot
	s.cells[slot] = c
	s.soonest = min(s.soonest, c.tat)
}

// remove deletes key, which holds slot, and frees the slot.
func (s *shard) remove(key bucket.Key, slot uint32) {
	delete(s.m, key)
	s.cells[slot] = cell{gcra: gcra{tat: minTime, frac: uint64(s.free)}}
	s.free = slot + 1
}

// evictFull deletes every bucket full at now, sets soonest to the earliest
// TAT left, and returns how many it deleted. The caller holds s.mu.
func (s *shard) evictFull(now int64) int {
	n := 0
	soonest := int64(math.MaxInt64)
	for k, slot := range s.m {
		b := &s.cells[slot]
		if b.fullAt(now) {
			s.remove(k, slot)
			n++
			continue
		}
		soonest = min(soonest, b.tat)
	}
	s.soonest = soonest
	return n
}

// makeRoom deletes a bucket that is full at now, to make room for a new one,
// and reports whether it found one. It never deletes a partly drained
// bucket: that would forget tokens its key has spent and let it exceed its
// limit. Before soonest nothing is full and it answers at once. Otherwise it
// inspects evictSample buckets from a random place in the map, and if none
// is full, walks the whole shard (dropping every full bucket and making
// soonest exact) when perShard/evictScanDivisor calls have passed since the
// last walk. Between walks it may miss a full bucket that sampling did not
// see; the insert is then refused although room existed, which errs on the
// safe side and lasts until the next walk or Run. The caller holds s.mu.
func (s *shard) makeRoom(now int64, perShard int) bool {
	if s.walkIn > 0 {
		s.walkIn--
	}
	if now < s.soonest {
		return false
	}
	seen := 0
	for k, slot := range s.m { // Go starts map iteration at a random place
		if s.cells[slot].fullAt(now) {
			s.remove(k, slot)
			return true
		}
		if seen++; seen == evictSample {
			break
		}
	}
	if s.walkIn > 0 {
		return false
	}
	s.walkIn = perShard / evictScanDivisor
	return s.evictFull(now) > 0
}

// shardSet returns the set of shards that hits touch, as a bitmask.
func (l *Limiter) shardSet(hits []bucket.Hit) uint64 {
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
