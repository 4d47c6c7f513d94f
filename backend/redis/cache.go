package redis

import (
	"encoding/binary"
	"sync"
	"time"

	"github.com/sluice-rls/sluice/bucket"
)

const (
	// cacheShards splits the empty-bucket cache so that concurrent requests
	// on different keys rarely share a mutex. A power of two.
	cacheShards = 64
	// defaultCacheSize bounds the empty-bucket cache when Options leaves it 0.
	defaultCacheSize = 1 << 16
)

// emptyCache remembers buckets Redis reported holding less than one token,
// until the time their next token is due. A bucket cannot refill sooner (only
// a give-back can add tokens early, and this node's own give-backs drop the
// entry), so a hit costing at least one token on a remembered bucket is
// refused exactly as Redis would refuse it, without a round trip.
//
// Times come from the node's clock, sampled before the Redis call that
// reported the bucket, so entries expire no later than Redis' own answer.
//
// An entry holds only for the Limit it was reported under: a bucket key is
// its rule and values, not its numbers, and under a changed Limit the
// script converts the bucket (a raised limit may leave it tokens), so a hit
// with another Limit misses and goes to Redis.
type emptyCache struct {
	perShard int
	shards   [cacheShards]cacheShard
}

type cacheShard struct {
	mu sync.Mutex
	m  map[bucket.Key]emptyEntry
}

// emptyEntry is one empty bucket under limit: next is when its next whole
// token is due, full when it is full again.
type emptyEntry struct {
	next, full time.Time
	limit      bucket.Limit
}

// newEmptyCache returns a cache of at most size entries, or nil (no cache)
// when size < 0.
func newEmptyCache(size int) *emptyCache {
	if size < 0 {
		return nil
	}
	if size == 0 {
		size = defaultCacheSize
	}
	c := &emptyCache{perShard: max(size/cacheShards, 1)}
	for i := range c.shards {
		c.shards[i].m = make(map[bucket.Key]emptyEntry)
	}
	return c
}

func (c *emptyCache) shard(k bucket.Key) *cacheShard {
	// The key is already a hash: any 8 bytes of it spread evenly.
	return &c.shards[binary.LittleEndian.Uint64(k[8:])%cacheShards]
}

// get returns the entry of k if it was reported under lim and its next
// token is still due after now. An entry under another Limit is dropped.
func (c *emptyCache) get(k bucket.Key, lim bucket.Limit, now time.Time) (emptyEntry, bool) {
	if c == nil {
		return emptyEntry{}, false
	}
	s := c.shard(k)
	s.mu.Lock()
	e, ok := s.m[k]
	if ok && (!now.Before(e.next) || e.limit != lim) {
		delete(s.m, k)
		ok = false
	}
	s.mu.Unlock()
	return e, ok
}

// put remembers k as empty until e.next. A full shard first drops its
// expired entries, then an arbitrary one.
func (c *emptyCache) put(k bucket.Key, e emptyEntry, now time.Time) {
	if c == nil {
		return
	}
	s := c.shard(k)
	s.mu.Lock()
	if _, ok := s.m[k]; !ok && len(s.m) >= c.perShard {
		for key, v := range s.m {
			if !now.Before(v.next) {
				delete(s.m, key)
			}
		}
		if len(s.m) >= c.perShard {
			for key := range s.m {
				delete(s.m, key)
				break
			}
		}
	}
	s.m[k] = e
	s.mu.Unlock()
}

// drop forgets k, after this node gave tokens back to it.
func (c *emptyCache) drop(k bucket.Key) {
	if c == nil {
		return
	}
	s := c.shard(k)
	s.mu.Lock()
	delete(s.m, k)
	s.mu.Unlock()
}

// cachedState is the answer Redis would give for a take on a bucket known to
// be empty until e.next.
func cachedState(h *bucket.Hit, e emptyEntry, now time.Time) bucket.State {
	reset := e.full.Sub(now)
	retry := e.next.Sub(now)
	if h.Cost > h.Limit.Burst {
		retry = reset
	} else if h.Cost > 1 { // (never 0: a check asks Redis)
		interval := h.Limit.Period / time.Duration(h.Limit.Requests)
		retry += time.Duration(h.Cost-1) * interval
	}
	return bucket.State{RetryAfter: retry, ResetAfter: max(reset, retry)}
}
