package lease

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/sluice-rls/sluice/backend/leaseproto"
	"github.com/sluice-rls/sluice/bucket"
)

// Defaults of Options.
const (
	// DefaultPeriod is how long a node keeps unused leased tokens before it
	// gives them back: the longest that tokens parked on one node cannot
	// serve another.
	DefaultPeriod = time.Second
	// DefaultMaxLease bounds one lease, whatever the bucket holds.
	DefaultMaxLease = 1000
	// DefaultTick is how often the background loop looks for expired
	// leases; a prefetch does not wait for it (it is signalled).
	DefaultTick = 100 * time.Millisecond
)

// The low-water mark: a key's prefetch is queued when the tokens the node
// holds fall to lowWaterNum/lowWaterDen of its last lease.
const lowWaterNum, lowWaterDen = 1, 2

// Leaser takes, leases and gives back tokens of Redis buckets in one call
// of package leaseproto's ops: backend/redis.Limiter.Lease, whose
// documentation gives the semantics.
type Leaser interface {
	Lease(ctx context.Context, ops []leaseproto.Op, out []leaseproto.Reply) error
}

// Options configures a Limiter.
type Options struct {
	// Leaser is the Redis side of the leases. Required.
	Leaser Leaser
	// Exact decides the hits that are not leased (their Rule says exact,
	// or it says nothing under an exact Default). Nil: every hit is
	// leased.
	Exact bucket.Limiter
	// Default is the consistency of hits whose Rule sets none
	// (--consistency).
	Default Consistency
	// Clock is the node clock: lease periods, and the node's estimate of
	// its buckets between calls (clockwork.NewRealClock() when nil).
	Clock clockwork.Clock
	// Period is the lease period (DefaultPeriod when 0).
	Period time.Duration
	// MaxLease bounds one lease (DefaultMaxLease when 0).
	MaxLease uint64
	// Tick is how often Run gives back expired leases (DefaultTick when 0).
	Tick time.Duration
	// Nodes returns the number of live nodes sharing the buckets (the
	// heartbeat registry); a lease is at most the tokens left divided by
	// twice that. Nil: one node.
	Nodes func() int
	// Metrics counts leases (nil: not counted).
	Metrics *Metrics
	// Autostart starts Run at the first hit the Limiter leases, in a
	// goroutine of its own that Close stops and waits for: a node whose
	// rules lease nothing runs no lease loop, and one whose rules come to
	// lease (a reload) starts it then. Without it the caller runs Run.
	Autostart bool
	// EagerLeases leases from a key's first decision. By default a key
	// seen for the first time (or idle for a lease period) is decided
	// exactly, without a lease, and leased from its next decision: keys
	// hit once in a while then cost no lease and no give-back.
	EagerLeases bool
}

// Limiter is the leased global layer. It is safe for concurrent use. Run
// gives back expired leases and fetches the next ones in the background
// (Options.Autostart starts it); Close gives back every lease.
//
// Per key it holds the tokens leased and not spent (held) and an estimate
// of Redis' bucket: the instant it would be full, from the last reply. The
// State of a hit decided from a lease is that estimate: what Redis reported
// at the last call on the key, refilled since on the node's clock, plus the
// tokens the node holds. It is exact on a single node; with several, the
// other nodes' spending since that call is not in it, so it may report
// tokens they have taken since (it never counts a token twice: held tokens
// are not in Redis).
type Limiter struct {
	opts  Options
	clock clockwork.Clock

	mu      sync.Mutex
	entries map[bucket.Key]*entry
	fetch   map[bucket.Key]bool // keys to prefetch
	ends    poolEnds            // the pools' ends: Run gives back the ended ones
	pending []leaseproto.Op     // pools to give back in Run's next round
	swept   time.Time           // Run's last sweep of idle entries
	closed  bool

	batch *batcher // the decisions' Lease calls

	lowNum, lowDen uint64 // the low-water mark (lowWaterNum/lowWaterDen; the sizing sweep sets others)

	nudge chan struct{} // a prefetch is wanted
	done  chan struct{} // closed by Close: Run returns
	runMu sync.Mutex    // held by Run's call: Close waits for it

	started atomic.Bool    // Options.Autostart's Run is started (or Close came first)
	runs    sync.WaitGroup // Options.Autostart's Run
}

// entry is the node's state of one leased key.
type entry struct {
	key   bucket.Key
	limit bucket.Limit
	held  uint64 // leased tokens not spent
	// fullLo and fullHi bound when Redis' bucket is full, as of the last
	// reply: its reset after the call's send, and after its reply. The
	// durations of a state come from fullLo, never longer than Redis would
	// say; its Remaining from fullHi, never more tokens than Redis had.
	fullLo, fullHi time.Time
	lastLease      uint64 // size of the last lease granted
	// The pool: the leases granted since the first one it holds, which
	// Redis counts as parked until the pool is closed (a leaseproto.Return) or
	// its count's window passes. granted is Redis' clock at its first
	// grant (zero: no pool), pooled the tokens it was granted in all, and
	// expires its end, one lease period after the send of the first
	// grant's call: its held tokens are never spent after, and go back.
	granted, pooled uint64
	expires         time.Time
	used            time.Time // last decision on the key
	fetching        bool      // a prefetch is queued or in flight
	// fresh marks an entry made for the decision at hand: its first
	// decision within a lease period leases nothing (Options.EagerLeases).
	fresh bool
	// emptyUntil is when Redis' bucket has a whole token again, as its
	// last reply said (the empty-bucket cache); zero when not known empty.
	emptyUntil time.Time
}

// New returns a Limiter; call Run in a goroutine of its own, and Close.
func New(opts Options) *Limiter {
	if opts.Clock == nil {
		opts.Clock = clockwork.NewRealClock()
	}
	if opts.Period <= 0 {
		opts.Period = DefaultPeriod
	}
	if opts.MaxLease == 0 {
		opts.MaxLease = DefaultMaxLease
	}
	if opts.Tick <= 0 {
		opts.Tick = DefaultTick
	}
	return &Limiter{
		opts:    opts,
		clock:   opts.Clock,
		entries: map[bucket.Key]*entry{},
		fetch:   map[bucket.Key]bool{},
		batch:   &batcher{leaser: windowed{opts.Leaser, 2 * opts.Period}},
		lowNum:  lowWaterNum,
		lowDen:  lowWaterDen,
		nudge:   make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
}

// windowed stamps every op with the window Redis counts its leases for:
// twice the lease period, as a pool's tokens are spent within one lease
// period of its first grant's send, and the second period covers the
// Redis calls that spend reserved tokens after their pool's end.
type windowed struct {
	Leaser
	window time.Duration
}

// Lease stamps ops' Window and passes them on.
func (w windowed) Lease(ctx context.Context, ops []leaseproto.Op, out []leaseproto.Reply) error {
	for i := range ops {
		ops[i].Window = w.window
	}
	return w.Leaser.Lease(ctx, ops, out)
}

// Shared reports true: leased buckets live in Redis, shared by the fleet.
func (l *Limiter) Shared() bool { return true }

// leased reports whether h is decided from leases.
func (l *Limiter) leased(h *bucket.Hit) bool {
	if l.opts.Exact == nil {
		return true
	}
	def := l.opts.Default == Leased
	if r, ok := h.Rule.(Rule); ok {
		return r.Leased(def)
	}
	return def
}

// Hit decides hits as bucket.Hit documents: the leased ones from the
// node's leases (and Redis when they hold too few tokens), the others
// through Options.Exact, all-or-nothing across both. An error means a
// needed Redis call failed: the tokens the call reserved are back in the
// node's leases, and the caller falls back.
func (l *Limiter) Hit(ctx context.Context, hits []bucket.Hit, states []bucket.State) (bucket.Decision, error) {
	if len(states) < len(hits) {
		return bucket.Decision{}, fmt.Errorf("backend/lease: %d states for %d hits", len(states), len(hits))
	}
	// Count first, allocating nothing: exact mode's path costs one loop.
	nLeased := 0
	for i := range hits {
		if l.leased(&hits[i]) {
			nLeased++
		}
	}
	if nLeased > 0 && l.opts.Autostart && !l.started.Load() {
		l.start()
	}
	switch {
	case len(hits) == 0:
		return bucket.Decision{Allowed: true}, nil
	case nLeased == 0:
		return l.opts.Exact.Hit(ctx, hits, states)
	case nLeased == len(hits):
		return l.hitLeased(ctx, hits, states, nil)
	}
	return l.hitMixed(ctx, hits, states, nLeased)
}

// hitMixed decides hits of which nLeased are leased and the others exact:
// the leased hits first; the exact ones then, with their takes only when
// the leased ones were allowed. Each part is decided in a copy of its hits
// in call order, so that hitLeased's steps see leased hits alone.
func (l *Limiter) hitMixed(ctx context.Context, hits []bucket.Hit, states []bucket.State, nLeased int) (bucket.Decision, error) {
	// part holds the leased hits, then the exact ones, and room for the
	// refusing take below; from[j] is the call index of part[j].
	part := make([]bucket.Hit, len(hits), len(hits)+1)
	pstates := make([]bucket.State, len(hits)+1)
	from := make([]int, len(hits))
	li, ei := 0, nLeased
	for i := range hits {
		j := ei
		if l.leased(&hits[i]) {
			j, li = li, li+1
		} else {
			ei++
		}
		part[j], from[j] = hits[i], i
	}
	lh, ls := part[:nLeased], pstates[:nLeased]
	taken := make([]taken, 0, nLeased) // a key per leased hit at most: never grows
	dl, err := l.hitLeased(ctx, lh, ls, &taken)
	if err != nil {
		return dl, err
	}
	eh, es := part[nLeased:], pstates[nLeased:]
	if !dl.Allowed {
		// Refused already: the exact takes go with a take of a Requests 0
		// limit, which every Limiter refuses without taking anything or
		// converting its bucket, so that they report their buckets as they
		// are and take nothing.
		eh = append(eh, bucket.Hit{Key: eh[0].Key, Limit: bucket.Limit{Period: time.Second}})
	}
	de, err := l.opts.Exact.Hit(ctx, eh, es)
	if err != nil || !de.Allowed || de.Answer != bucket.Decided {
		l.putBack(taken) // the exact layer refused or failed: nothing spent
		l.untouched(lh, ls)
	}
	if err != nil {
		return de, err
	}
	for j, i := range from {
		states[i] = pstates[j]
	}
	return bucket.Decision{Allowed: dl.Allowed && de.Allowed, Answer: de.Answer}, nil
}

// taken is tokens a decision spent from a key's pool (whose end was
// until), for putBack.
type taken struct {
	key    bucket.Key
	tokens uint64
	until  time.Time
}

// putBack returns tokens a decision spent from the node's pools into them
// (they left Redis, which counts them as parked). Tokens Redis took in the
// decision's own call are not parked, and a pool may have ended meanwhile:
// those are lost, never admitted.
func (l *Limiter) putBack(ts []taken) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	for _, t := range ts {
		if e := l.entries[t.key]; e != nil {
			l.restore(e, t.tokens, t.until, now)
		}
	}
}

// restore puts n tokens reserved from e's pool that ended at until back
// into it, unless that pool ended or was closed: the tokens are then lost
// (Redis no longer counts them as parked). Called with mu held.
func (l *Limiter) restore(e *entry, n uint64, until, now time.Time) {
	if n > 0 && e.granted != 0 && e.expires.Equal(until) && now.Before(until) {
		e.held += n
	}
}

// closePool returns the op that gives e's held tokens back and closes its
// pool in Redis (none when e has no pool), and empties it. Called with mu
// held.
func (l *Limiter) closePool(e *entry, decision uint64) (leaseproto.Op, bool) {
	if e.granted == 0 {
		return leaseproto.Op{}, false
	}
	op := leaseproto.Op{Key: e.key, Limit: e.limit, Decision: decision, Kind: leaseproto.Return, Take: e.held, Since: e.granted, Unpark: e.pooled}
	l.opts.Metrics.given(e.held)
	e.held, e.granted, e.pooled, e.expires, e.emptyUntil = 0, 0, 0, time.Time{}, time.Time{}
	return op, true
}

// untouched reports the takes among leased hits of a refused decision as
// their buckets stand, untouched.
func (l *Limiter) untouched(hits []bucket.Hit, states []bucket.State) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	for i := range hits {
		h := &hits[i]
		if !isTake(h) || h.Limit.Requests == 0 || !states[i].Allowed {
			continue
		}
		if e := l.entries[h.Key]; e != nil && e.limit == h.Limit {
			st := l.estimate(e, now, 0)
			st.Allowed = true
			states[i] = st
		}
	}
}

// keyNeed aggregates the takes of one key in one decision.
type keyNeed struct {
	key      bucket.Key
	limit    bucket.Limit
	total    uint64    // tokens the takes take
	need     uint64    // tokens that must exist: max over takes of the ones before plus cost (0: not in debt)
	reserved uint64    // held tokens reserved for it
	close    bool      // Redis decides it: its pool goes back first
	until    time.Time // the end of the pool they came from
	op       int       // index of its leaseproto.Op, or -1: decided from the lease
	refused  bool
	retry    time.Duration
	later    uint64 // tokens of takes after the one a state is for
	// other marks a key met under another limit too in the same decision
	// (a limit changed between its hits): decided in Redis alone, neither
	// from nor into the lease, its state from the reply (rem, reset).
	other bool
	e     *entry // the key's entry, for the decision under mu
	rem   uint64
	reset time.Duration
}

// isTake reports whether h is one of the takes hitLeased decides
// together: neither a Give nor Independent (loose decides those).
func isTake(h *bucket.Hit) bool {
	return !h.Give && !h.Independent
}

// needs is a decision's takes aggregated per key and limit. A request has
// a few keys: a linear search in a stack array beats a map, which would
// allocate on every call.
type needs []keyNeed

// find returns the index of k under lim, or -1.
func (ns needs) find(k bucket.Key, lim bucket.Limit) int {
	for n := range ns {
		if ns[n].key == k && ns[n].limit == lim {
			return n
		}
	}
	return -1
}

// leasedDecision is one hitLeased call as its steps pass it on. The steps
// that send ops or store what they are given take its needs alone, not a
// pointer to it: the needs' stack array must not escape to the heap (a
// decision from the leases allocates nothing, TestFromLeaseAllocs).
type leasedDecision struct {
	needs needs
	// zero: a take of a Requests 0 limit refuses the decision. checks are
	// then the Redis replies of the keys the node held nothing of, checked
	// by index in needs (-1: not checked).
	zero    bool
	checks  []leaseproto.Reply
	checked []int
	allowed bool
	send    time.Time // the send of the decision's Redis call, if any
}

// hitLeased decides hits that are all leased (Hit passes the leased ones
// alone, so its steps ask no hit's rule again), in steps:
// collect aggregates the takes per key; check asks Redis about the keys a
// Requests 0 take leaves unknown (the decision is refused), or decide
// reserves held tokens and sends what the leases cannot answer to Redis;
// settle puts back what a refused decision reserved, or records what an
// allowed one spent when spent is not nil; states reports each take;
// loose then applies the gives and independent hits.
func (l *Limiter) hitLeased(ctx context.Context, hits []bucket.Hit, states []bucket.State, spent *[]taken) (bucket.Decision, error) {
	var buf [8]keyNeed
	var d leasedDecision
	d.needs, d.zero = l.collect(buf[:0], hits, states)
	d.allowed = !d.zero
	var err error
	switch {
	case len(d.needs) == 0:
	case d.zero:
		d.checks, d.checked, err = l.check(ctx, d.needs)
	default:
		d.allowed, d.send, err = l.decide(ctx, d.needs)
	}
	if err != nil {
		return bucket.Decision{}, err
	}
	l.settle(d.needs, d.allowed, spent)
	l.states(&d, hits, states)
	if err := l.loose(ctx, hits, states); err != nil {
		return bucket.Decision{}, err
	}
	return bucket.Decision{Allowed: d.allowed, Answer: bucket.Decided}, nil
}

// collect aggregates the takes of leased hits into ns; a take of a
// Requests 0 limit refuses the decision (zero) and gets its state here.
func (l *Limiter) collect(ns needs, hits []bucket.Hit, states []bucket.State) (_ needs, zero bool) {
	for i := range hits {
		h := &hits[i]
		if !isTake(h) {
			continue
		}
		if h.Limit.Requests == 0 {
			zero = true
			states[i] = bucket.State{RetryAfter: h.Limit.Period, ResetAfter: h.Limit.Period}
			continue
		}
		n := ns.find(h.Key, h.Limit)
		if n < 0 {
			n = len(ns)
			ns = append(ns, keyNeed{key: h.Key, limit: h.Limit, op: -1})
		}
		k := &ns[n]
		k.need = max(k.need, k.total+h.Cost)
		k.total += h.Cost
	}
	return ns, zero
}

// check handles a decision refused by a Requests 0 take: the keys the node
// holds nothing of (no entry, or one under another limit) are checked in
// Redis, taking nothing, so that their states tell their buckets. checked
// is each key's index in checks, -1 when not checked.
func (l *Limiter) check(ctx context.Context, needs needs) (checks []leaseproto.Reply, checked []int, _ error) {
	var ops []leaseproto.Op
	checked = make([]int, len(needs))
	l.mu.Lock()
	for n := range needs {
		k := &needs[n]
		checked[n] = -1
		if e := l.entries[k.key]; e == nil || e.limit != k.limit {
			checked[n] = len(ops)
			ops = append(ops, leaseproto.Op{
				Key: k.key, Limit: k.limit, Decision: 1,
				Kind: leaseproto.Independent, Need: k.need, Share: l.share(),
			})
		}
	}
	l.mu.Unlock()
	if len(ops) == 0 {
		return nil, checked, nil
	}
	checks = make([]leaseproto.Reply, len(ops))
	err := l.batch.do(ctx, ops, checks)
	l.opts.Metrics.redisCall()
	if err != nil {
		return nil, nil, fmt.Errorf("backend/lease: %w", err)
	}
	return checks, checked, nil
}

// decide decides the takes of d: from the node's leases when they hold
// enough for every key, else in one Redis call (plan's ops) sent at send,
// whose replies apply records. A failed call puts the reserved tokens back.
func (l *Limiter) decide(ctx context.Context, needs needs) (allowed bool, send time.Time, _ error) {
	l.mu.Lock()
	ops, cached := l.plan(needs, l.clock.Now())
	l.mu.Unlock()
	if cached || len(ops) == 0 {
		l.opts.Metrics.fromLease()
		return !cached, time.Time{}, nil
	}
	replies := make([]leaseproto.Reply, len(ops))
	send = l.clock.Now()
	err := l.batch.do(ctx, ops, replies)
	l.opts.Metrics.redisCall()
	if err != nil {
		l.restoreReserved(needs)
		return false, send, fmt.Errorf("backend/lease: %w", err)
	}
	return l.apply(ops, replies, needs, send), send, nil
}

// plan reserves held tokens for each key of needs and returns the ops of
// the decision's Redis call: the give-backs of pools that go back first
// (keys met under another limit, pools past their end, and the pools of
// the keys Redis decides), then the takes, one decision in lease.lua.
// cached reports a key refused from the empty-bucket cache: the decision
// is refused without Redis, and no op is returned. Called with mu held.
func (l *Limiter) plan(needs needs, now time.Time) (ops []leaseproto.Op, cached bool) {
	for n := range needs {
		needs[n].e = l.entry(needs[n].key, needs[n].limit, now, &ops)
	}
	var takes []leaseproto.Op
	for n := range needs {
		if l.planKey(&needs[n], now, &takes) {
			cached = true
		}
	}
	for n := range needs {
		needs[n].e.fresh = false
	}
	if cached {
		// Refused without Redis (a limit change's give-back is lost:
		// never more tokens).
		for n := range needs {
			needs[n].op = -1
		}
		return nil, true
	}
	for n := range needs {
		if needs[n].close {
			if op, ok := l.closePool(needs[n].e, 0); ok {
				ops = append(ops, op)
			}
		}
	}
	for n := range needs {
		if needs[n].op >= 0 {
			needs[n].op += len(ops)
		}
	}
	return append(ops, takes...), false
}

// planKey decides how k is answered: from its lease (its tokens reserved),
// refused from the empty-bucket cache (reported true), or by Redis (a take
// appended to takes, k.op its index). Called with mu held.
func (l *Limiter) planKey(k *keyNeed, now time.Time, takes *[]leaseproto.Op) (cached bool) {
	e := k.e // entry resets an entry in place: still the key's
	e.used = now
	switch {
	case e.limit != k.limit:
		// The key under two limits in this decision: the entry follows the
		// last; this one is Redis' alone.
		k.other = true
		l.redisTake(k, k.total, 0, takes)
	case k.need > k.limit.Burst:
		// Never allowed: Redis reports the bucket, the lease stays (its
		// durations from the call's send).
		k.refused = true
		l.redisTake(k, 0, 0, takes)
	case e.held >= max(k.need, 1):
		// Held tokens are not in debt: a check (need 0) passes on one.
		k.until = e.expires
		e.held -= k.total
		k.reserved = k.total
		l.lowWater(k.key, e)
	case e.held == 0 && k.need > 0 && now.Before(e.emptyUntil):
		// Known empty (the empty-bucket cache): refused without Redis until
		// its next token is due. (A check asks Redis: it is refused only in
		// debt, which the cache does not know.)
		k.until = e.expires
		interval := e.limit.Period / time.Duration(e.limit.Requests)
		k.refused, k.retry = true, e.emptyUntil.Sub(now)+time.Duration(k.need-1)*interval
		return true
	default:
		// Redis decides: the key's pool goes back first (its held tokens
		// into Redis, its grants out of the count of parked tokens), and
		// the take asks Redis for everything, in the same call; its lease
		// starts the next pool. A key's first decision leases nothing:
		// rarely hit keys stay exact.
		k.until = e.expires
		k.close = true
		extra := l.maxLease(k.limit)
		if e.fresh && !l.opts.EagerLeases {
			extra = 0
		}
		l.redisTake(k, k.total, extra, takes)
	}
	return false
}

// redisTake appends the take of k that Redis decides, taking take tokens
// when k.need exist and leasing up to extra more.
func (l *Limiter) redisTake(k *keyNeed, take, extra uint64, takes *[]leaseproto.Op) {
	op := l.takeOp(k, 1, k.need, take)
	op.Extra = extra
	*takes = append(*takes, op)
	k.op = len(*takes) - 1
}

// restoreReserved puts the tokens reserved for needs back into their
// leases (restore).
func (l *Limiter) restoreReserved(needs needs) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	for n := range needs {
		if e := l.entries[needs[n].key]; e != nil {
			l.restore(e, needs[n].reserved, needs[n].until, now)
		}
	}
}

// settle puts back what a refused decision reserved (nothing spent), or
// records in spent, when not nil, what an allowed one spent from leases.
func (l *Limiter) settle(needs needs, allowed bool, spent *[]taken) {
	if !allowed {
		l.restoreReserved(needs)
		return
	}
	if spent == nil {
		return
	}
	for _, k := range needs {
		if k.reserved > 0 && !k.other {
			*spent = append(*spent, taken{key: k.key, tokens: k.reserved, until: k.until})
		}
	}
}

// states reports the takes of leased hits, each seeing the takes of its
// key before it.
func (l *Limiter) states(d *leasedDecision, hits []bucket.Hit, states []bucket.State) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	for n := range d.needs {
		d.needs[n].later = 0
		if d.allowed {
			d.needs[n].later = d.needs[n].total
		}
	}
	for i := range hits {
		h := &hits[i]
		if !isTake(h) || h.Limit.Requests == 0 {
			continue
		}
		n := d.needs.find(h.Key, h.Limit)
		k := &d.needs[n]
		e := l.entries[h.Key]
		if d.zero && d.checked[n] >= 0 {
			states[i] = checkedState(&d.checks[d.checked[n]])
			continue
		}
		if d.zero && (e == nil || e.limit != h.Limit) {
			// An entry dropped since the check: nothing known.
			states[i] = bucket.State{Allowed: true}
			continue
		}
		if d.allowed {
			k.later -= h.Cost
		}
		states[i] = l.takeState(d, k, e, now)
	}
}

// checkedState is the state of a take checked in Redis by check.
func checkedState(r *leaseproto.Reply) bucket.State {
	st := bucket.State{Allowed: r.Allowed, Remaining: r.Remaining, ResetAfter: r.Reset}
	if !r.Allowed {
		st.RetryAfter = r.Retry
	}
	return st
}

// takeState is the state of a take of k (entry e), with k.later tokens of
// the key's takes after it. Called with mu held.
func (l *Limiter) takeState(d *leasedDecision, k *keyNeed, e *entry, now time.Time) bucket.State {
	at := now
	if k.op >= 0 {
		at = d.send // answered from Redis: its durations as Redis gave them
	}
	var st bucket.State
	if k.other {
		interval := k.limit.Period / time.Duration(k.limit.Requests)
		st = bucket.State{
			Remaining:  min(k.rem+k.later, k.limit.Burst),
			ResetAfter: max(k.reset-time.Duration(k.later)*interval, 0),
		}
	} else {
		st = l.estimateAt(e, at, now, k.later)
	}
	switch {
	case k.refused:
		st.RetryAfter = k.retry
		if k.need > k.limit.Burst {
			st.RetryAfter = st.ResetAfter
		}
	case !d.allowed && k.op < 0 && !k.other && st.Remaining < k.need:
		// Refused without Redis for another key: this one, as the node
		// sees its bucket, lacks tokens too.
		interval := k.limit.Period / time.Duration(k.limit.Requests)
		st.RetryAfter = st.ResetAfter
		if k.need <= k.limit.Burst {
			st.RetryAfter = max(st.ResetAfter-time.Duration(k.limit.Burst-k.need)*interval, 0)
		}
	default:
		st.Allowed = true
	}
	return st
}

// takeOp is the leaseproto.Op of a take of k.
func (l *Limiter) takeOp(k *keyNeed, decision, need, take uint64) leaseproto.Op {
	return leaseproto.Op{
		Key: k.key, Limit: k.limit, Decision: decision, Kind: leaseproto.Take,
		Need: need, Take: take, Extra: l.maxLease(k.limit), Share: l.share(),
	}
}

// maxLease bounds a lease of lim: MaxLease, and the tokens lim refills in
// one lease period, so that the tokens of a node that dies holding leases
// are back within one period (its bucket refills them), and a limit
// slower than a token per period is never leased (every decision exact).
// After Close, nothing.
func (l *Limiter) maxLease(lim bucket.Limit) uint64 {
	if l.closed || lim.Requests == 0 || lim.Period <= 0 {
		return 0
	}
	perPeriod := float64(lim.Requests) * float64(l.opts.Period) / float64(lim.Period)
	return min(l.opts.MaxLease, uint64(perPeriod))
}

// share is the divisor of a lease: twice the live nodes, so that the
// fleet never parks more than about half of what is left.
func (l *Limiter) share() uint64 {
	n := 1
	if l.opts.Nodes != nil {
		n = max(l.opts.Nodes(), 1)
	}
	return 2 * uint64(n)
}

// entry returns k's entry, creating it; a key met with another limit, or
// whose pool ended, gives its held tokens back and closes its pool first
// (as an op of an earlier decision).
// Called with mu held.
func (l *Limiter) entry(k bucket.Key, lim bucket.Limit, now time.Time, ops *[]leaseproto.Op) *entry {
	e := l.entries[k]
	if e == nil {
		e = &entry{key: k, limit: lim, fullLo: now, fullHi: now, fresh: true}
		l.entries[k] = e
		return e
	}
	if e.limit != lim || (e.granted != 0 && !now.Before(e.expires)) {
		// Another limit, or a pool past its end: its tokens go back
		// first.
		if op, ok := l.closePool(e, 0); ok {
			*ops = append(*ops, op)
		}
	}
	if e.limit != lim {
		*e = entry{key: k, limit: lim, fullLo: now, fullHi: now, fresh: true}
	}
	return e
}

// apply records the replies of a decision's call and reports whether it
// was allowed.
func (l *Limiter) apply(ops []leaseproto.Op, replies []leaseproto.Reply, needs []keyNeed, send time.Time) bool {
	allowed := true
	for n := range needs {
		k := &needs[n]
		if k.op >= 0 && !replies[k.op].Allowed {
			allowed = false
		}
	}
	for n := range needs {
		k := &needs[n]
		if k.need > k.limit.Burst {
			allowed = false
			k.refused = true
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	for n := range needs {
		// Run forgets idle keys without a pool: a call slower than a
		// lease period can come back to a key forgotten meanwhile. It
		// held nothing; it starts again from this reply.
		if k := &needs[n]; l.entries[k.key] == nil {
			l.entries[k.key] = &entry{key: k.key, limit: k.limit, fullLo: send, fullHi: now, fresh: true, used: now}
		}
	}
	for j, op := range ops {
		e := l.entries[op.Key]
		if e == nil || e.limit != op.Limit {
			continue // a give-back of an old limit
		}
		r := &replies[j]
		e.fullLo, e.fullHi = send.Add(r.Reset), now.Add(r.Reset)
		if r.Leased > 0 {
			l.grant(e, r, send, now)
		}
		l.rememberEmpty(e, op, r, send)
	}
	for n := range needs {
		k := &needs[n]
		e := l.entries[k.key]
		if k.op >= 0 {
			r := &replies[k.op]
			k.rem, k.reset = r.Remaining, r.Reset
			if !r.Allowed {
				k.refused = true
				k.retry = r.Retry
			}
		}
		if allowed && k.reserved > k.total {
			l.restore(e, k.reserved-k.total, k.until, now) // a check's reserved tokens
			k.reserved = k.total
		}
		l.lowWater(k.key, e)
	}
	return allowed
}

// rememberEmpty puts e in the empty-bucket cache when a take's reply left
// Redis' bucket without a whole token and the node holds none: until the
// next token is due (from the send: never later than Redis would say),
// e's takes are refused without Redis. Another node's give-back may refill
// it sooner: then this node refuses for at most one token interval more
// than it must (never admits more). Called with mu held.
func (l *Limiter) rememberEmpty(e *entry, op leaseproto.Op, r *leaseproto.Reply, send time.Time) {
	if op.Kind == leaseproto.Give || op.Kind == leaseproto.Return || r.Remaining > 0 || e.held > 0 || e.limit.Requests == 0 {
		e.emptyUntil = time.Time{}
		return
	}
	interval := e.limit.Period / time.Duration(e.limit.Requests)
	next := r.Reset - time.Duration(e.limit.Burst-1)*interval
	if next > 0 {
		e.emptyUntil = send.Add(next)
	}
}

// grant adds the lease of reply r, to a call sent at send, to e's pool;
// it starts a new pool when e has none, or when e's ended (which Run's
// next round then gives back). Called with mu held.
func (l *Limiter) grant(e *entry, r *leaseproto.Reply, send, now time.Time) {
	if e.granted != 0 && !now.Before(e.expires) {
		if op, ok := l.closePool(e, 0); ok {
			l.pending = append(l.pending, op)
			select {
			case l.nudge <- struct{}{}:
			default:
			}
		}
	}
	if e.granted == 0 {
		e.granted, e.pooled, e.expires = r.Granted, 0, send.Add(l.opts.Period)
		heap.Push(&l.ends, poolEnd{at: e.expires, key: e.key})
	}
	e.pooled += r.Leased
	e.held += r.Leased
	e.lastLease = r.Leased
	l.opts.Metrics.leased(r.Leased)
}

// lowWater queues a prefetch of k when its lease ran down to the low-water
// mark (half of the last one). Called with mu held.
func (l *Limiter) lowWater(k bucket.Key, e *entry) {
	if e.fetching || e.lastLease < 2 || e.held*l.lowDen > e.lastLease*l.lowNum || l.closed {
		return
	}
	e.fetching = true
	l.fetch[k] = true
	select {
	case l.nudge <- struct{}{}:
	default:
	}
}

// estimate is the State of e's bucket at now as the node sees it, with
// extra tokens still held: Redis' bucket at the last reply, refilled since,
// plus the held tokens. Allowed and RetryAfter are left to the caller.
// Called with mu held.
func (l *Limiter) estimate(e *entry, now time.Time, extra uint64) bucket.State {
	return l.estimateAt(e, now, now, extra)
}

// estimateAt is estimate for a state answered from a reply: durations at
// send (as Redis measured them), Remaining at now.
func (l *Limiter) estimateAt(e *entry, send, now time.Time, extra uint64) bucket.State {
	lim := e.limit
	if lim.Requests == 0 {
		return bucket.State{ResetAfter: lim.Period}
	}
	interval := float64(lim.Period) / float64(lim.Requests)
	held := float64(e.held+extra) * interval
	debt := max(float64(e.fullLo.Sub(send))-held, 0)
	debtHi := max(float64(e.fullHi.Sub(now))-held, 0)
	tau := float64(lim.Burst) * interval
	r := (tau - debtHi + float64(time.Microsecond)) / interval
	var rem uint64
	if r >= 1 {
		rem = min(uint64(r), lim.Burst)
	}
	return bucket.State{Remaining: rem, ResetAfter: time.Duration(debt)}
}

// loose applies the gives and independent hits among leased hits, one
// by one in call order, after the takes: from the lease when it holds
// enough, else in one Redis call, each op its own decision. A give returns
// the key's held tokens with it.
func (l *Limiter) loose(ctx context.Context, hits []bucket.Hit, states []bucket.State) error {
	var ops []leaseproto.Op
	var refs []int // hit of each op
	l.mu.Lock()
	now := l.clock.Now()
	for i := range hits {
		h := &hits[i]
		if isTake(h) {
			continue
		}
		if h.Limit.Requests == 0 {
			if h.Give {
				states[i] = bucket.State{Allowed: true}
			} else {
				states[i] = bucket.State{RetryAfter: h.Limit.Period, ResetAfter: h.Limit.Period}
			}
			continue
		}
		e := l.entry(h.Key, h.Limit, now, &ops)
		fromLease := !h.Give && e.held >= max(h.Cost, 1) && h.Cost <= h.Limit.Burst
		if h.Give || (!fromLease && h.Cost <= h.Limit.Burst) {
			// Redis decides: the key's pool goes back first (so that
			// Redis counts only the other nodes' leases as parked when
			// it clamps a give), and a take asks Redis for everything.
			if op, ok := l.closePool(e, uint64(len(ops)+1)); ok {
				ops = append(ops, op)
			}
		}
		for len(refs) < len(ops) {
			refs = append(refs, -1)
		}
		e.used = now
		d := uint64(len(ops) + 1)
		switch {
		case h.Give:
			ops = append(ops, leaseproto.Op{Key: h.Key, Limit: h.Limit, Decision: d, Kind: leaseproto.Give, Take: h.Cost})
			e.emptyUntil = time.Time{}
		case fromLease:
			e.held -= h.Cost
			st := l.estimate(e, now, 0)
			st.Allowed = true
			states[i] = st
			continue
		default:
			ops = append(ops, leaseproto.Op{
				Key: h.Key, Limit: h.Limit, Decision: d, Kind: leaseproto.Independent,
				Need: h.Cost, Take: h.Cost, Extra: l.maxLease(h.Limit), Share: l.share(),
				Overdraw: h.Overdraw,
			})
			if h.Cost > h.Limit.Burst && !h.Overdraw {
				ops[len(ops)-1].Take = 0
			}
		}
		refs = append(refs, i)
	}
	l.mu.Unlock()
	if len(ops) == 0 {
		return nil
	}
	replies := make([]leaseproto.Reply, len(ops))
	send := l.clock.Now()
	err := l.batch.do(ctx, ops, replies)
	l.mu.Lock()
	defer l.mu.Unlock()
	now = l.clock.Now()
	if err != nil {
		// The pools given back in the call are lost (it may have run).
		return fmt.Errorf("backend/lease: %w", err)
	}
	for j, op := range ops {
		e := l.entries[op.Key]
		r := &replies[j]
		if e == nil || e.limit != op.Limit {
			continue
		}
		e.fullLo, e.fullHi = send.Add(r.Reset), now.Add(r.Reset)
		switch {
		case refs[j] < 0:
			continue
		case op.Kind == leaseproto.Independent && r.Leased > 0:
			l.grant(e, r, send, now)
		}
		st := l.estimateAt(e, send, now, 0)
		if op.Kind == leaseproto.Give || r.Allowed {
			st.Allowed = true
		} else {
			st.RetryAfter = r.Retry
			if op.Need > op.Limit.Burst {
				st.RetryAfter = st.ResetAfter
			}
		}
		states[refs[j]] = st
	}
	return nil
}

// errClosed is Run's answer after Close.
var errClosed = errors.New("backend/lease: closed")
