package memory

import (
	"context"
	"math/bits"
	"sync"
	"time"

	"github.com/sluice-rls/sluice/descriptors"
)

// DefaultMaxBuckets is the capacity used when Options.MaxBuckets is 0: about
// a million partly drained buckets, at most some 80 MB of maps.
const DefaultMaxBuckets = 1 << 20

// stackHits is how many hits a call can make before its undo log needs
// pooled memory instead of the stack. Requests rarely carry more descriptors.
const stackHits = 16

// Options configures a Limiter. The zero value is ready to use.
type Options struct {
	// Now is the clock Hit and Run use; nil means time.Now. HitAt and EvictAt
	// take the time as an argument instead.
	Now func() time.Time

	// MaxBuckets bounds the number of buckets held; 0 means
	// DefaultMaxBuckets. The bound is split evenly over the shards, so a
	// shard may fill, and evict, a little before the whole limiter does.
	//
	// An insert into a full shard drops a bucket. Refilled buckets go first,
	// which loses nothing: every so often the insert walks the shard for
	// them, and otherwise it samples a few buckets and drops the one nearest
	// to full. When more than MaxBuckets keys are partly drained at once,
	// that bucket is partly drained too: its key forgets what it spent and
	// starts full next time, so it can admit up to Burst more hits than its
	// limit allows. Size MaxBuckets above the number of keys that can be
	// active within one refill time to avoid this.
	MaxBuckets int
}

// Limiter holds token buckets in memory, one per descriptors.Key, and decides
// hits against them. Each bucket refills Requests tokens per Period
// continuously, holds at most Burst tokens, and starts full.
//
// Buckets live in a power-of-two number of mutex-guarded shards chosen by key
// hash; a call locks only the shards its hits touch. A full bucket is the same
// as an absent one, so buckets are stored only while partly drained, and Run
// or EvictAt drops those that have refilled.
//
// A Key is expected to come with the same Limit every time (bucket keys
// include the limit). If it changes, the bucket keeps the instant at which it
// will be full and its tokens are derived from that under the new Limit.
//
// Use HitAt when the caller already has the time (tests, or one clock
// reading per request); Hit reads the Limiter's clock. A Limiter must be
// created with New and is safe for concurrent use.
type Limiter struct {
	now      func() time.Time
	epoch    time.Time // time 0 of buckets' nanosecond clock
	shards   []shard
	shift    uint // 64 - log2(len(shards)), for shardIndex
	perShard int  // capacity of each shard
	logs     sync.Pool
}

// change is an undo-log entry: key's bucket before a call changed it.
type change struct {
	key     descriptors.Key
	old     bucket
	existed bool
}

// New returns a Limiter with no buckets.
func New(opts Options) *Limiter {
	return newLimiter(opts, maxShards)
}

// newLimiter is New with the shard count (rounded down to a power of two)
// chosen by the caller, for benchmarks.
func newLimiter(opts Options, shards int) *Limiter {
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	maxBuckets := opts.MaxBuckets
	if maxBuckets <= 0 {
		maxBuckets = DefaultMaxBuckets
	}
	n, perShard := shardLayout(maxBuckets, shards)
	l := &Limiter{
		now:      now,
		epoch:    now(),
		shards:   make([]shard, n),
		shift:    uint(64 - bits.TrailingZeros(uint(n))),
		perShard: perShard,
	}
	for i := range l.shards {
		l.shards[i].m = make(map[descriptors.Key]bucket)
	}
	return l
}

// Hit is HitAt at the Limiter's clock. It takes a context and returns an
// error so that *Limiter satisfies the service's Limiter interface; it never
// blocks on anything but its own mutexes and never returns an error.
func (l *Limiter) Hit(_ context.Context, hits []descriptors.Hit, states []descriptors.BucketState) (bool, error) {
	return l.HitAt(l.now(), hits, states), nil
}

// HitAt decides hits at time now, writes one state per hit into states, and
// reports whether every hit without Independent set was allowed.
//
// The decision is all-or-nothing: tokens are taken, and Give hits return
// theirs, only when every non-Independent hit is allowed; otherwise none of
// those hits changes any bucket. An Independent hit is decided on its own,
// takes its tokens when they exist, and never blocks the others. Hits apply in
// order, so a Key that appears twice sees its first hit's effect.
//
// A Give hit is always allowed and adds Cost tokens, never above Burst. Cost
// 0 checks for at least one token and takes nothing. A Cost above Burst, and
// any hit on a Limit with Requests 0, is refused.
//
// Each state's Allowed and RetryAfter give the hit's decision. Remaining and
// ResetAfter describe its bucket as the call leaves it: after the hit when
// the call is allowed; when it is refused, after the rollback (and after any
// Independent hits on the same key).
//
// Times are kept as nanoseconds from the Limiter's creation, so now must lie
// within ±292 years of it; times beyond saturate. HitAt panics if
// len(states) < len(hits). It does not allocate: existing buckets cost no
// memory, new ones only their share of map growth.
func (l *Limiter) HitAt(now time.Time, hits []descriptors.Hit, states []descriptors.BucketState) bool {
	if len(hits) == 0 {
		return true
	}
	states = states[:len(hits)]
	t := l.nanos(now)
	set := l.shardSet(hits)
	l.lock(set)
	defer l.unlock(set)
	defer l.trim(set, t)
	if len(hits) <= stackHits {
		var stack [stackHits]change
		return l.decide(hits, t, states, stack[:0])
	}
	p := l.getLog(len(hits))
	defer l.logs.Put(p)
	return l.decide(hits, t, states, (*p)[:0])
}

// decide is HitAt once the shards are locked, with log an empty undo log
// with room for len(hits) changes. It does not retain log, which lets HitAt
// keep small logs on its stack.
func (l *Limiter) decide(hits []descriptors.Hit, t int64, states []descriptors.BucketState, log []change) bool {
	ok := true
	for i := range hits {
		h := &hits[i]
		old, existed, changed := l.apply(h, t, &states[i])
		if !states[i].Allowed && !h.Independent {
			ok = false
		}
		if changed {
			log = append(log, change{key: h.Key, old: old, existed: existed})
		}
	}
	if !ok {
		l.rollback(log)
		l.settle(hits, t, states)
	}
	return ok
}

// apply decides h at t against its stored bucket, stores the result when it
// changed, and returns the bucket as it was before. The caller holds the
// shard's lock.
func (l *Limiter) apply(h *descriptors.Hit, t int64, st *descriptors.BucketState) (old bucket, existed, changed bool) {
	sh := &l.shards[shardIndex(&h.Key, l.shift)]
	old, existed = sh.m[h.Key]
	if !existed {
		old = bucket{tat: minTime}
	}
	next, s, changed := apply(old, h.Limit, t, h.Cost, h.Give)
	*st = s
	if changed {
		sh.store(h.Key, next, t)
	}
	return old, existed, changed
}

// rollback undoes log, newest first. The caller holds the shards' locks.
func (l *Limiter) rollback(log []change) {
	for i := len(log) - 1; i >= 0; i-- {
		c := &log[i]
		sh := &l.shards[shardIndex(&c.key, l.shift)]
		if c.existed {
			sh.m[c.key] = c.old
		} else {
			delete(sh.m, c.key)
		}
	}
}

// settle finishes a refused call after rollback: it applies the Independent
// hits again, in order, to the buckets as they really are, and refreshes the
// other hits' Remaining and ResetAfter. The caller holds the shards' locks.
func (l *Limiter) settle(hits []descriptors.Hit, t int64, states []descriptors.BucketState) {
	for i := range hits {
		if hits[i].Independent {
			l.apply(&hits[i], t, &states[i])
		}
	}
	for i := range hits {
		h := &hits[i]
		if h.Independent {
			continue
		}
		b, ok := l.shards[shardIndex(&h.Key, l.shift)].m[h.Key]
		if !ok {
			b = bucket{tat: minTime}
		}
		_, now, _ := apply(b, h.Limit, t, 0, false)
		states[i].Remaining, states[i].ResetAfter = now.Remaining, now.ResetAfter
	}
}

// getLog returns a pooled undo log with room for n changes. The pool holds
// pointers to slices so that Get and Put do not allocate.
func (l *Limiter) getLog(n int) *[]change {
	if p, ok := l.logs.Get().(*[]change); ok && cap(*p) >= n {
		return p
	}
	s := make([]change, 0, n)
	return &s
}

// nanos returns t as nanoseconds since the Limiter's epoch. Times more than
// ~292 years from it saturate.
func (l *Limiter) nanos(t time.Time) int64 {
	return int64(t.Sub(l.epoch))
}

// Len returns the number of buckets held: those partly drained and not yet
// evicted. It locks one shard at a time, so under load it is approximate.
func (l *Limiter) Len() int {
	n := 0
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}
