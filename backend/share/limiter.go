package share

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/sluice-rls/sluice/backend/memory"
	"github.com/sluice-rls/sluice/bucket"
)

// Membership says whether this node may hold standing shares now, and how
// many nodes they are split over: the node registry in Redis.
type Membership interface {
	// ShareAt reports the node count n a share is sized by (f/n of a
	// rule's limit) and whether this node may hold a share at now, an
	// instant of the layer's Clock: only while every live node counts it
	// in its n.
	ShareAt(now time.Time) (n int, ok bool)
}

// Rule is what the layer reads of a hit's rule (bucket.Hit.Rule), which
// descriptors.Rule implements. A hit whose Rule does not implement it has
// no share.
type Rule interface {
	// ShareMillionths returns the rule's share f in millionths, 0 < f <
	// 1000000: the part of the limit the live nodes hold, f/n each, beside
	// Redis' part 1 − f; 0: none. def is the layer's Default, for a rule
	// that sets none. Integers, so that the parts never add up to more
	// than the limit.
	ShareMillionths(def uint32) uint32
}

// Options configures a Limiter.
type Options struct {
	// Inner is the global layer behind: it decides every hit that is not
	// decided by a share, share rules' at Redis' part. Required.
	Inner bucket.Limiter
	// Membership gives n and whether this node holds shares. Required.
	Membership Membership
	// Clock is the cells' clock (clockwork.NewRealClock() when nil), and
	// the membership's: a call asks Membership at the instant it decides.
	Clock clockwork.Clock
	// Default is the share in millionths of the rules that set none and
	// may hold one (Rule): --share, 0 under --quota-mode.
	Default uint32
	// MaxBuckets bounds the cells held (memory.Options.MaxBuckets): a key
	// that finds no room goes to Redis' part.
	MaxBuckets int
	// Metrics counts the layer's decisions (nil: not counted).
	Metrics *Metrics
}

// Limiter is the standing-shares layer (see the package documentation).
// It is safe for concurrent use; Run evicts refilled cells and watches the
// membership.
type Limiter struct {
	opts    Options
	clock   clockwork.Clock
	cells   *memory.Limiter
	holding atomic.Pointer[holding]
	scratch sync.Pool
}

// holding is this node's share as the layer last saw it: sized by n,
// held when ok, since the instant the layer first saw it so.
type holding struct {
	n     int
	ok    bool
	since time.Time
}

// since returns the instant from which this node holds its share as
// (n, ok) says: the first call, or Run's look, that saw it so. Every cell
// was empty then (memory.Limiter.HitSince), so a cell has only what it
// refilled since, at (n, ok)'s rate: it gains nothing when n drops, keeps
// nothing from before a time its node was not admitted, and starts empty.
// Seeing a change late only empties the cells later: since reads the
// clock when it records a change, never earlier, also when the caller
// saw (n, ok) some time ago.
func (l *Limiter) since(n int, ok bool) time.Time {
	for {
		h := l.holding.Load()
		if h != nil && h.n == n && h.ok == ok {
			return h.since
		}
		next := &holding{n: n, ok: ok, since: l.clock.Now()}
		if l.holding.CompareAndSwap(h, next) {
			return next.since
		}
	}
}

// New returns a Limiter with no cells.
func New(opts Options) *Limiter {
	if opts.Clock == nil {
		opts.Clock = clockwork.NewRealClock()
	}
	return &Limiter{
		opts:  opts,
		clock: opts.Clock,
		cells: memory.New(memory.Options{Clock: opts.Clock, MaxBuckets: opts.MaxBuckets}),
		scratch: sync.Pool{New: func() any {
			return new(scratch)
		}},
	}
}

// watchEvery is how often Run looks at the membership, so that a share
// starts, its cells empty, about when it is granted and not at the first
// call after, which would find them empty.
const watchEvery = 100 * time.Millisecond

// Run drops refilled cells every memory.DefaultEvictEvery, and looks at
// the membership every watchEvery, until ctx is done.
func (l *Limiter) Run(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.cells.Run(ctx, memory.DefaultEvictEvery)
	}()
	defer func() { <-done }()
	ticker := l.clock.NewTicker(watchEvery)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.Chan():
			l.since(l.opts.Membership.ShareAt(l.clock.Now()))
		}
	}
}

// Len returns the number of cells held: those partly spent.
func (l *Limiter) Len() int { return l.cells.Len() }

// FullRefusals returns how many cell takes found no room (each went to
// Redis' part instead).
func (l *Limiter) FullRefusals() uint64 { return l.cells.FullRefusals() }

// Shared reports whether the layer behind is shared: the keys are its.
func (l *Limiter) Shared() bool { return l.opts.Inner.Shared() }

// share returns h's share in millionths when h is decided with shares:
// its rule has one, and it is not a charge, which must land where every
// node sees its debt; else 0.
func (l *Limiter) share(h *bucket.Hit) uint32 {
	if r, ok := h.Rule.(Rule); ok && !h.Overdraw {
		return r.ShareMillionths(l.opts.Default)
	}
	return 0
}

// take reports whether h is a take that may be decided by a cell: neither
// a give nor a check.
func take(h *bucket.Hit) bool { return !h.Give && h.Cost > 0 }

// plan is what one hit of a call does.
type plan struct {
	share   uint32       // its share in millionths (Limiter.share); 0: none
	cell    bucket.Limit // its share cell's limit, for a share hit
	useCell bool         // its cell is tried (the node holds shares, and the cell has a token)
	cellAt  int          // its hit in the cells' first call; -1: none
	giveAt  int          // its give in the cells' second call; -1: none
	innerAt int          // its hit in the call behind; -1: none
	give    uint64       // tokens of a give its cell takes
}

// scratch holds one call's buffers, pooled.
type scratch struct {
	since       time.Time // the cells were empty then (Limiter.since)
	plans       []plan
	cellHits    []bucket.Hit
	cellStates  []bucket.State
	inner       []bucket.Hit
	innerStates []bucket.State
	back        []bucket.Hit
	backStates  []bucket.State
}

func (l *Limiter) get(n int) *scratch {
	sc := l.scratch.Get().(*scratch)
	sc.plans = grow(sc.plans, n)
	sc.cellHits, sc.inner, sc.back = sc.cellHits[:0], sc.inner[:0], sc.back[:0]
	return sc
}

// Hit decides hits as bucket.Hit documents. A call without a share hit
// goes to the layer behind untouched. Otherwise each take of a share hit
// first tries its cell; the hits no cell decided go to the layer behind
// in one call, and when it refuses, fails or skips the call, the tokens
// the cells gave are given back.
//
// Gives fill their cell up to what it lacks and send the rest to Redis'
// part; checks (Cost 0) go to Redis' part, where debt is kept, and
// independent hits try their cell first. A hit decided by its cell
// reports the cell's state; one decided behind reports that state with
// the cell's Remaining added (what this node may still take), its
// RetryAfter the sooner of the two when the cell can ever hold the cost.
func (l *Limiter) Hit(ctx context.Context, hits []bucket.Hit, states []bucket.State) (bucket.Decision, error) {
	if !l.anyShared(hits) {
		return l.opts.Inner.Hit(ctx, hits, states)
	}
	sc := l.get(len(hits))
	defer l.scratch.Put(sc)
	// One instant for the membership and the cells: a share is spent
	// right when it is seen held.
	now := l.clock.Now()
	n, ok := l.opts.Membership.ShareAt(now)
	sc.since = l.since(n, ok)
	l.plan(sc, hits, n, ok)
	l.cellCalls(sc, hits, now)
	l.innerHits(sc, hits)
	if len(sc.inner) == 0 {
		l.opts.Metrics.decided(true)
		for i := range hits {
			states[i] = l.cellState(sc, i)
		}
		return bucket.Decision{Allowed: true}, nil
	}
	l.opts.Metrics.decided(false)
	sc.innerStates = grow(sc.innerStates, len(sc.inner))
	d, err := l.opts.Inner.Hit(ctx, sc.inner, sc.innerStates)
	decided := err == nil && d.Answer != bucket.Skipped && d.Answer != bucket.Bypassed
	if !decided || !d.Allowed {
		l.giveBack(sc, hits)
	}
	if !decided {
		return d, err
	}
	for i := range hits {
		states[i] = l.state(sc, hits, i)
	}
	return d, nil
}

// anyShared reports whether some hit is decided with shares.
func (l *Limiter) anyShared(hits []bucket.Hit) bool {
	for i := range hits {
		if l.share(&hits[i]) > 0 {
			return true
		}
	}
	return false
}

// plan fills sc.plans: each hit's share, a share hit's cell, and whether
// it is tried. When it is not, the hit goes to Redis' part alone, never
// to the whole limit (innerHits).
func (l *Limiter) plan(sc *scratch, hits []bucket.Hit, n int, ok bool) {
	for i := range hits {
		h, p := &hits[i], &sc.plans[i]
		*p = plan{share: l.share(h), cellAt: -1, giveAt: -1, innerAt: -1}
		if !ok || p.share == 0 {
			continue
		}
		p.cell = cellLimit(h.Limit, p.share, n)
		p.useCell = p.cell.Burst > 0 && p.cell.Requests > 0
	}
}

// cellCalls decides the cells' part: a first call with every take (each
// on its own: an Independent take takes only when its cell has the
// tokens), then the independent hits, and a check of the cell of each
// give and check; a second call with the gives, each at most what its
// cell lacks.
func (l *Limiter) cellCalls(sc *scratch, hits []bucket.Hit, now time.Time) {
	add := func(i int, cost uint64) {
		sc.plans[i].cellAt = len(sc.cellHits)
		sc.cellHits = append(sc.cellHits, bucket.Hit{Key: hits[i].Key, Limit: sc.plans[i].cell, Cost: cost, Independent: true})
	}
	for i := range hits {
		if h := &hits[i]; sc.plans[i].useCell && take(h) && !h.Independent {
			add(i, h.Cost)
		}
	}
	for i := range hits {
		switch h := &hits[i]; {
		case !sc.plans[i].useCell:
		case h.Give || h.Cost == 0:
			add(i, 0) // what a give may fill, or a check's Remaining
		case h.Independent:
			add(i, h.Cost)
		}
	}
	if len(sc.cellHits) == 0 {
		return
	}
	sc.cellStates = grow(sc.cellStates, len(sc.cellHits))
	l.cells.HitSince(now, sc.since, sc.cellHits, sc.cellStates)
	first := len(sc.cellHits)
	for i := range hits {
		h, p := &hits[i], &sc.plans[i]
		if !p.useCell || !h.Give {
			continue
		}
		// What the cell lacks, in whole tokens: never more than it takes
		// (a fraction of a token may be lost, never made up).
		p.give = min(h.Cost, p.cell.Burst-min(sc.cellStates[p.cellAt].Remaining, p.cell.Burst))
		if p.give > 0 {
			p.giveAt = len(sc.cellHits)
			sc.cellHits = append(sc.cellHits, bucket.Hit{Key: h.Key, Limit: p.cell, Cost: p.give, Give: true})
		}
	}
	if len(sc.cellHits) > first {
		sc.cellStates = grow(sc.cellStates, len(sc.cellHits))
		l.cells.HitSince(now, sc.since, sc.cellHits[first:], sc.cellStates[first:])
	}
}

// innerHits fills sc.inner with the hits the layer behind decides: those
// without a share as they are; takes and independent hits their cell did
// not allow, checks, and the rest of gives, at Redis' part.
func (l *Limiter) innerHits(sc *scratch, hits []bucket.Hit) {
	for i := range hits {
		h, p := hits[i], &sc.plans[i]
		switch {
		case p.share == 0:
		case !p.useCell:
			h.Limit = redisLimit(h.Limit, p.share)
		case h.Give:
			if h.Cost == p.give {
				continue
			}
			h.Cost -= p.give
			h.Limit = redisLimit(h.Limit, p.share)
		case take(&h) && sc.cellStates[p.cellAt].Allowed:
			continue
		default: // a check, or a take its cell could not hold
			h.Limit = redisLimit(h.Limit, p.share)
		}
		p.innerAt = len(sc.inner)
		sc.inner = append(sc.inner, h)
	}
}

// giveBack returns what the cells gave the call's takes, when the call
// is not allowed after all.
func (l *Limiter) giveBack(sc *scratch, hits []bucket.Hit) {
	for i := range hits {
		if h, p := &hits[i], &sc.plans[i]; sc.tookFromCell(h, p) {
			sc.back = append(sc.back, bucket.Hit{Key: h.Key, Limit: p.cell, Cost: h.Cost, Give: true})
		}
	}
	if len(sc.back) == 0 {
		return
	}
	sc.backStates = grow(sc.backStates, len(sc.back))
	l.cells.HitSince(l.clock.Now(), sc.since, sc.back, sc.backStates)
	j := 0
	for i := range hits {
		if h, p := &hits[i], &sc.plans[i]; sc.tookFromCell(h, p) {
			// The take's state describes its cell as the call leaves it.
			c := &sc.cellStates[p.cellAt]
			c.Remaining, c.ResetAfter = sc.backStates[j].Remaining, sc.backStates[j].ResetAfter
			j++
		}
	}
}

// tookFromCell reports whether h, planned p, is a take its cell allowed.
func (sc *scratch) tookFromCell(h *bucket.Hit, p *plan) bool {
	return p.cellAt >= 0 && take(h) && !h.Independent && sc.cellStates[p.cellAt].Allowed
}

// cellState returns the state of hit i of a call its cells decided.
func (l *Limiter) cellState(sc *scratch, i int) bucket.State {
	p := &sc.plans[i]
	if p.giveAt >= 0 {
		return sc.cellStates[p.giveAt]
	}
	return sc.cellStates[p.cellAt]
}

// state returns hit i's state once the layer behind decided.
func (l *Limiter) state(sc *scratch, hits []bucket.Hit, i int) bucket.State {
	p := &sc.plans[i]
	switch {
	case p.innerAt < 0:
		return l.cellState(sc, i)
	case p.cellAt < 0:
		return sc.innerStates[p.innerAt]
	}
	return merge(sc.innerStates[p.innerAt], l.cellState(sc, i), hits[i].Cost, p.cell.Burst)
}

// merge returns the state of a hit decided behind (in) whose cell is in
// c: in, with the cell's tokens added to Remaining, the sooner RetryAfter
// when the cell can ever hold cost, and the later ResetAfter.
func merge(in, c bucket.State, cost, cellBurst uint64) bucket.State {
	in.Remaining = satAdd(in.Remaining, c.Remaining)
	if !in.Allowed && cost <= cellBurst && c.RetryAfter > 0 {
		in.RetryAfter = min(in.RetryAfter, c.RetryAfter)
	}
	in.ResetAfter = max(in.ResetAfter, c.ResetAfter)
	return in
}

func satAdd(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return ^uint64(0)
}

// grow returns s with length n, keeping its contents and reusing its
// array when large enough (slices.Grow, resliced).
func grow[T any](s []T, n int) []T { return slices.Grow(s, max(0, n-len(s)))[:n] }

var _ bucket.Limiter = (*Limiter)(nil)
