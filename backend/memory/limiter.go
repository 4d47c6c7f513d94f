package memory

import (
	"context"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/sluice-rls/sluice/bucket"
)

// DefaultMaxBuckets is the capacity used when Options.MaxBuckets is 0:
// about a million partly drained buckets. Full, they hold 87 MB of live heap
// (83 bytes a bucket, BenchmarkBucketMemory); a busy process collects when
// its heap has doubled, so budget about twice that.
const DefaultMaxBuckets = 1 << 20

// stackHits is how many hits a call can make before its undo log needs
// pooled memory instead of the stack. Requests rarely carry more descriptors.
const stackHits = 16

// Options configures a Limiter. The zero value is ready to use.
type Options struct {
	// Clock is the clock Hit and Run use: Hit reads its time, Run waits on
	// its timers. Nil means clockwork.NewRealClock(). HitAt and EvictAt take
	// the time as an argument instead.
	Clock clockwork.Clock

	// MaxBuckets bounds the number of buckets held; 0 means
	// DefaultMaxBuckets. The bound is split evenly over the shards, so a
	// shard may fill a little before the whole limiter does.
	//
	// Only full buckets are ever dropped, since they are the same as absent
	// ones. A hit that needs a new bucket in a full shard takes the room of
	// one that has refilled; when none has, the hit is refused (Remaining 0,
	// RetryAfter until the shard's first bucket refills) and so is its call,
	// and FullRefusals counts it. A key is thus never allowed more than its
	// limit, but while more than MaxBuckets keys are partly drained at once
	// new keys are refused. Checks (Cost 0) and give-backs need no room. Size
	// MaxBuckets above the number of keys that can be drained within one
	// refill time; a bucket costs about 83 bytes of live heap.
	MaxBuckets int
}

// Limiter holds token buckets in memory, one per bucket.Key, and decides
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
	clock    clockwork.Clock
	epoch    time.Time // time 0 of buckets' nanosecond clock
	shards   []shard
	shift    uint // 64 - log2(len(shards)), for shardIndex
	perShard int  // capacity of each shard
	logs     sync.Pool
	refusals atomic.Uint64 // hits refused for want of room, for FullRefusals
}

// change is an undo-log entry: key's bucket before take idx changed it,
// under that take's Limit (Limiter.apply converts a bucket to its hit's
// Limit before deciding, so the Limit need not be logged: the entry stays
// as small as before buckets recorded one). An entry with noRoom set
// changed nothing: it records that take idx was refused for want of room
// (see refuseFull), so that settle keeps its state.
type change struct {
	key     bucket.Key
	old     gcra
	existed bool
	noRoom  bool
	idx     int32
}

// New returns a Limiter with no buckets.
func New(opts Options) *Limiter {
	return newLimiter(opts, maxShards)
}

// newLimiter is New with the shard count (rounded down to a power of two)
// chosen by the caller, for benchmarks.
func newLimiter(opts Options, shards int) *Limiter {
	clock := opts.Clock
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	maxBuckets := opts.MaxBuckets
	if maxBuckets <= 0 {
		maxBuckets = DefaultMaxBuckets
	}
	n, perShard := shardLayout(maxBuckets, shards)
	l := &Limiter{
		clock:    clock,
		epoch:    clock.Now(),
		shards:   make([]shard, n),
		shift:    uint(64 - bits.TrailingZeros(uint(n))),
		perShard: perShard,
	}
	for i := range l.shards {
		l.shards[i].m = make(map[bucket.Key]uint32)
		l.shards[i].soonest = math.MaxInt64
	}
	return l
}

// Hit is HitAt at the Limiter's clock, as bucket.Limiter. It never blocks
// on anything but its own mutexes, always decides (Answer Decided) and never
// returns an error.
func (l *Limiter) Hit(_ context.Context, hits []bucket.Hit, states []bucket.State) (bucket.Decision, error) {
	return bucket.Decision{Allowed: l.HitAt(l.clock.Now(), hits, states)}, nil
}

// Shared reports false: the buckets never leave this process, so their keys
// may be node-local (bucket.NodeHasher).
func (l *Limiter) Shared() bool { return false }

// HitAt decides hits at time now, writes one state per hit into states, and
// reports whether every hit that is neither Give nor Independent was allowed.
//
// The hits are decided in two passes, in the order bucket.Hit documents
// (backend/redis' script uses the same). First the takes (hits neither Give
// nor Independent), in call order and all-or-nothing: each is decided
// against its bucket as the call's earlier takes leave it, and tokens are
// taken only when every take is allowed; otherwise no take changes any
// bucket. Then the Give and Independent hits, one by one in call order,
// whatever the takes' decision, each against its bucket as everything
// before it left it: an Independent hit takes its tokens when they exist
// (with Overdraw, also when they do not, into debt) and never blocks the
// others; a Give is always allowed and adds Cost tokens (never above
// Burst).
//
// Cost 0 checks that the bucket is not in debt and takes nothing. A Cost above
// Burst, any take or check on a Limit with Requests 0, and a hit that needs
// a new bucket in a shard full of partly drained ones (see
// Options.MaxBuckets) are refused. A Give to a Limit with Requests 0 does
// nothing.
//
// Each state's Allowed and RetryAfter give the hit's decision. Remaining and
// ResetAfter describe its bucket as the call leaves it: after the hit (and
// the hits decided before it) when the call is allowed; when it is refused,
// those of a take describe its bucket with every take undone and the call's
// Give and Independent hits applied. (backend/redis reports them before the
// Give and Independent hits, and a refused take as the call's earlier takes
// left its bucket.)
//
// Times are kept as nanoseconds from the Limiter's creation, so now must lie
// within ±292 years of it; times beyond saturate. HitAt panics if
// len(states) < len(hits). It does not allocate: existing buckets cost no
// memory, new ones only their share of the growth of their shard's map and
// slab.
func (l *Limiter) HitAt(now time.Time, hits []bucket.Hit, states []bucket.State) bool {
	if len(hits) == 0 {
		return true
	}
	return l.hitAt(l.nanos(now), minTime, hits, states[:len(hits)])
}

// HitSince is HitAt with every bucket read as empty at since: it holds
// at most the tokens it refilled after since, under its hit's Limit, and
// keeps what it lacked beyond that (a debt). Only the buckets the hits
// change are stored, as decided; HitAt reads the others as before. A
// since after now is read as now.
//
// It is for a share of a limit that must bring no tokens into a new
// holding: backend/share empties its cells whenever its node's share
// changes.
func (l *Limiter) HitSince(now, since time.Time, hits []bucket.Hit, states []bucket.State) bool {
	if len(hits) == 0 {
		return true
	}
	t := l.nanos(now)
	return l.hitAt(t, min(l.nanos(since), t), hits, states[:len(hits)])
}

// hitAt is HitAt at t with buckets empty at floor (minTime: never).
func (l *Limiter) hitAt(t, floor int64, hits []bucket.Hit, states []bucket.State) bool {
	set := l.shardSet(hits)
	l.lock(set)
	defer l.unlock(set)
	if len(hits) <= stackHits {
		var stack [stackHits]change
		return l.decide(hits, t, floor, states, stack[:0])
	}
	p := l.getLog(len(hits))
	defer l.logs.Put(p)
	return l.decide(hits, t, floor, states, (*p)[:0])
}

// decide is HitAt once the shards are locked, with log an empty undo log
// with room for len(hits) changes. It does not retain log, which lets HitAt
// keep small logs on its stack.
func (l *Limiter) decide(hits []bucket.Hit, t, floor int64, states []bucket.State, log []change) bool {
	// The takes, all-or-nothing: each is applied as it is decided, so that
	// a later take on its key sees it, and logged to be undone.
	ok, others := true, false
	noRoom := uint64(0)
	for i := range hits {
		h := &hits[i]
		if h.Give || h.Independent {
			others = true
			continue
		}
		old, existed, changed, full := l.apply(h, t, floor, &states[i])
		if !states[i].Allowed {
			ok = false
		}
		switch {
		case changed:
			log = append(log, change{key: h.Key, old: old.gcra, existed: existed, idx: int32(i)})
		case full:
			log = append(log, change{noRoom: true, idx: int32(i)})
			noRoom++
		}
	}
	if !ok {
		l.rollback(hits, log)
	}
	// Then the gives and independent hits, each on its own, whatever the
	// takes' decision.
	if others {
		for i := range hits {
			if h := &hits[i]; h.Give || h.Independent {
				// A give never needs room: it leaves a new bucket full.
				if _, _, _, full := l.apply(h, t, floor, &states[i]); full {
					noRoom++
				}
			}
		}
	}
	if !ok {
		l.settle(hits, t, floor, states, log)
	}
	if noRoom > 0 {
		l.refusals.Add(noRoom)
	}
	return ok
}

// apply decides h at t against its stored bucket, stores the result when it
// changed, and returns the bucket as it was before. A hit that would add a
// partly drained bucket to a full shard with no full bucket to drop is
// refused and changes nothing; apply then reports noRoom (the caller counts
// it). The caller holds the shard's lock.
func (l *Limiter) apply(h *bucket.Hit, t, floor int64, st *bucket.State) (old cell, existed, changed, noRoom bool) {
	sh := &l.shards[shardIndex(&h.Key, l.shift)]
	slot, existed := sh.m[h.Key] // the hit's only map operation on an existing bucket
	if !existed {
		old = absent
	} else if old = sh.cells[slot]; old.lim != h.Limit {
		b, converted := old.under(t, h.Limit)
		// Last written under another Limit: store it converted, so that
		// it refills at the new rate from now on, whatever this hit's
		// decision; the undo log then restores the converted bucket.
		if converted {
			old = b
			existed = sh.store(h.Key, slot, b, t)
		}
	}
	// old is under h.Limit now, unless it is full or h.Limit never allows.
	old.gcra = old.gcra.emptyAt(floor, h.Limit)
	next, s, changed := apply(old.gcra, h.Limit, t, h.Cost, h.Give, h.Overdraw && h.Independent)
	if changed && !existed && len(sh.m) >= l.perShard && !next.fullAt(t) && !sh.makeRoom(t, l.perShard) {
		*st = refuseFull(sh, h.Limit, t)
		return old, false, false, true
	}
	*st = s
	if changed {
		c := cell{gcra: next, lim: h.Limit}
		if existed {
			sh.store(h.Key, slot, c, t)
		} else if !c.fullAt(t) { // a full bucket is the same as none
			sh.insert(h.Key, c, l.perShard)
		}
	}
	return old, existed, changed, false
}

// refuseFull returns the state of a hit refused because its shard is full of
// partly drained buckets: no tokens, and a retry when the shard's first
// bucket refills and makes room (at least one token interval of the hit's
// limit, also when that time has passed without room being found).
func refuseFull(sh *shard, lim bucket.Limit, t int64) bucket.State {
	// apply refuses a Requests or Period of 0 before anything changes.
	wait := duration(u128{lo: uint64(lim.Period)}.ceilDiv(lim.Requests))
	if sh.soonest > t {
		wait = max(wait, duration(uint64(sh.soonest)-uint64(t)))
	}
	return bucket.State{RetryAfter: wait, ResetAfter: wait}
}

// rollback undoes log, newest first. The caller holds the shards' locks.
func (l *Limiter) rollback(hits []bucket.Hit, log []change) {
	for i := len(log) - 1; i >= 0; i-- {
		c := &log[i]
		if c.noRoom {
			continue
		}
		sh := &l.shards[shardIndex(&c.key, l.shift)]
		if c.existed {
			sh.put(c.key, cell{gcra: c.old, lim: hits[c.idx].Limit}, l.perShard)
		} else if slot, ok := sh.m[c.key]; ok {
			sh.remove(c.key, slot)
		}
	}
}

// settle finishes a refused call once its takes are undone and its Give and
// Independent hits applied: it refreshes the takes' Remaining and
// ResetAfter to their buckets as the call leaves them, except for those log
// says were refused for want of room, whose refusal stands (refuseFull).
// The caller holds the shards' locks.
func (l *Limiter) settle(hits []bucket.Hit, t, floor int64, states []bucket.State, log []change) {
	for i := range hits {
		h := &hits[i]
		if h.Independent || h.Give {
			continue
		}
		sh := &l.shards[shardIndex(&h.Key, l.shift)]
		b := absent
		if slot, ok := sh.m[h.Key]; ok {
			b = sh.cells[slot]
		}
		_, now, _ := apply(b.view(t, h.Limit).emptyAt(floor, h.Limit), h.Limit, t, 0, false, false)
		states[i].Remaining, states[i].ResetAfter = now.Remaining, now.ResetAfter
	}
	for i := range log {
		if c := &log[i]; c.noRoom {
			st := &states[c.idx]
			st.Remaining, st.ResetAfter = 0, st.RetryAfter // as refuseFull left it
		}
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

// FullRefusals returns how many hits the Limiter has refused because their
// key had no bucket and its shard was full of partly drained ones (see
// Options.MaxBuckets). Each such hit refuses its call as over limit.
func (l *Limiter) FullRefusals() uint64 { return l.refusals.Load() }

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
