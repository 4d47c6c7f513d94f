package lease_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/backend/lease"
	"github.com/sluice-rls/sluice/backend/leaseproto"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/internal/redistest"
)

// big is a limit far above the tests' load: a lease is half of what is
// left on one node.
var big = bucket.Limit{Requests: 1000, Period: time.Hour, Burst: 1000}

func key(t *testing.T, n int) bucket.Key {
	return bucket.SumKey(fmt.Appendf(nil, "%s/%d", t.Name(), n))
}

func take(k bucket.Key, lim bucket.Limit, cost uint64) bucket.Hit {
	return bucket.Hit{Key: k, Limit: lim, Cost: cost}
}

// leasedRule is a hit's rule whose consistency is leased (true) or exact.
type leasedRule bool

func (r leasedRule) Leased(bool) bool { return bool(r) }

// ruled returns h with rule r.
func ruled(h bucket.Hit, r leasedRule) bucket.Hit {
	h.Rule = r
	return h
}

func hit(t *testing.T, l *lease.Limiter, hits ...bucket.Hit) (bool, []bucket.State) {
	t.Helper()
	states := make([]bucket.State, len(hits))
	d, err := l.Hit(context.Background(), hits, states)
	if err != nil {
		t.Fatalf("Hit: %v", err)
	}
	return d.Allowed, states
}

// A node leases half of what is left at its first take, then decides from
// the lease without Redis; the tokens it holds are not in Redis.
func TestDecidesFromLease(t *testing.T) {
	srv := redistest.Start(t)
	clock := clockwork.NewFakeClock()
	l, r := newLimiter(t, srv, lease.Options{Clock: clock})
	k := key(t, 0)
	if ok, st := hit(t, l, take(k, big, 1)); !ok || st[0].Remaining != 999 {
		t.Fatalf("first take: %v %+v, want allowed, 999 left", ok, st)
	}
	calls := r.calls.Load()
	if got := r.inRedis(t, k, big); got != 500 {
		t.Errorf("Redis holds %d tokens after a take and a lease of half the rest, want 500", got)
	}
	for i := range 240 {
		if ok, st := hit(t, l, take(k, big, 1)); !ok || st[0].Remaining != uint64(998-i) {
			t.Fatalf("take %d from the lease: %v %+v, want allowed, %d left", i, ok, st, 998-i)
		}
	}
	if got := r.calls.Load() - calls; got != 0 {
		t.Errorf("%d Redis calls for 240 takes from a lease of 499, want 0", got)
	}
	// Past the lease, back to Redis (Run is not running: no prefetch).
	for range 259 {
		hit(t, l, take(k, big, 1))
	}
	if got := r.calls.Load() - calls; got != 0 {
		t.Errorf("%d Redis calls within the lease, want 0", got)
	}
	if ok, _ := hit(t, l, take(k, big, 1)); !ok || r.calls.Load()-calls != 1 {
		t.Errorf("the take after the lease: allowed %v after %d calls, want allowed after 1", ok, r.calls.Load()-calls)
	}
}

// Near the limit a lease is no token at all: every decision is Redis',
// until the bucket is empty; then the empty-bucket cache refuses without
// Redis until the next token is due.
func TestNearLimitIsExact(t *testing.T) {
	srv := redistest.Start(t)
	clock := clockwork.NewFakeClock()
	l, r := newLimiter(t, srv, lease.Options{Clock: clock})
	lim := bucket.Limit{Requests: 1, Period: time.Hour, Burst: 2}
	k := key(t, 0)
	for i, want := range []struct {
		allowed bool
		calls   int64
	}{{true, 1}, {true, 1}, {false, 0}, {false, 0}} {
		calls := r.calls.Load()
		ok, st := hit(t, l, take(k, lim, 1))
		if ok != want.allowed || r.calls.Load()-calls != want.calls {
			t.Errorf("take %d: allowed %v after %d Redis calls, want %v after %d", i, ok, r.calls.Load()-calls, want.allowed, want.calls)
		}
		if !ok && (st[0].RetryAfter <= 59*time.Minute || st[0].RetryAfter > time.Hour) {
			t.Errorf("take %d: RetryAfter %v, want the next token's hour", i, st[0].RetryAfter)
		}
	}
	clock.Advance(time.Hour) // the next token is due: Redis again
	calls := r.calls.Load()
	if ok, _ := hit(t, l, take(k, lim, 1)); r.calls.Load() != calls+1 {
		t.Errorf("after the next token's time: allowed %v after %d Redis calls, want 1", ok, r.calls.Load()-calls)
	}
}

// Without EagerLeases a key's first decision leases nothing; its next
// does.
func TestFirstDecisionExact(t *testing.T) {
	srv := redistest.Start(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	_, r := newLimiterOn(t, c, lease.Options{Clock: clockwork.NewFakeClock()})
	lazy := lease.New(lease.Options{Leaser: r, Exact: r.Limiter, Default: lease.Leased, Clock: clockwork.NewFakeClock(), Period: time.Hour})
	defer lazy.Close(context.Background())
	k := key(t, 0)
	hit(t, lazy, take(k, big, 1))
	if got := r.inRedis(t, k, big); got != 999 {
		t.Errorf("the first decision left %d in Redis, want 999 (no lease)", got)
	}
	hit(t, lazy, take(k, big, 1))
	if got := r.inRedis(t, k, big); got != 499 {
		t.Errorf("the second decision left %d in Redis, want 499 (a lease of half)", got)
	}
}

// A refused decision spends nothing of the node's lease: the tokens it
// reserved go back into it, not to Redis.
func TestRefusalKeepsLease(t *testing.T) {
	srv := redistest.Start(t)
	l, r := newLimiter(t, srv, lease.Options{Clock: clockwork.NewFakeClock()})
	a, b := key(t, 0), key(t, 1)
	tiny := bucket.Limit{Requests: 1, Period: time.Hour, Burst: 1}
	hit(t, l, take(a, big, 1))  // leases 499 of a
	hit(t, l, take(b, tiny, 1)) // empties b
	if ok, st := hit(t, l, take(a, big, 5), take(b, tiny, 1)); ok || !st[0].Allowed || st[0].Remaining != 999 {
		t.Fatalf("a refused decision: %v %+v, want refused, a untouched at 999", ok, st)
	}
	calls := r.calls.Load()
	if ok, st := hit(t, l, take(a, big, 499)); !ok || st[0].Remaining != 500 {
		t.Errorf("the whole lease after the refusal: %v %+v, want allowed, 500 left", ok, st)
	}
	if r.calls.Load() != calls {
		t.Errorf("the lease's 499 tokens cost %d Redis calls, want 0", r.calls.Load()-calls)
	}
	if got := r.inRedis(t, a, big); got != 500 {
		t.Errorf("Redis holds %d tokens of a, want 500", got)
	}
}

// The exact layer's refusal gives the leased hits' tokens back to the
// node's lease; an exact hit never leases.
func TestMixedExactAndLeased(t *testing.T) {
	srv := redistest.Start(t)
	l, r := newLimiter(t, srv, lease.Options{Clock: clockwork.NewFakeClock()})
	a, b := key(t, 0), key(t, 1)
	tiny := bucket.Limit{Requests: 1, Period: time.Hour, Burst: 1}
	la := ruled(take(a, big, 1), true)
	hit(t, l, la) // leases 499 of a
	if ok, _ := hit(t, l, ruled(take(b, tiny, 1), false)); !ok {
		t.Fatal("the exact take was refused")
	}
	la.Cost = 10
	if ok, st := hit(t, l, la, ruled(take(b, tiny, 1), false)); ok || st[0].Remaining != 999 {
		t.Fatalf("refused by the exact hit: %v %+v, want refused, a at 999", ok, st)
	}
	if got := r.inRedis(t, a, big); got != 500 {
		t.Errorf("Redis holds %d tokens of a, want 500", got)
	}
}

// Leased and exact hits interleaved: each state lands at its hit's index,
// a leased key's takes seeing the ones before it.
func TestMixedInterleavedStates(t *testing.T) {
	srv := redistest.Start(t)
	l, _ := newLimiter(t, srv, lease.Options{Clock: clockwork.NewFakeClock()})
	a, b, c := key(t, 0), key(t, 1), key(t, 2)
	lb := bucket.Limit{Requests: 10, Period: time.Hour, Burst: 10}
	lc := bucket.Limit{Requests: 20, Period: time.Hour, Burst: 20}
	hit(t, l, ruled(take(a, big, 1), true)) // leases 499 of a
	ok, st := hit(t, l,
		ruled(take(b, lb, 2), false),
		ruled(take(a, big, 1), true),
		ruled(take(c, lc, 3), false),
		ruled(take(a, big, 4), true),
	)
	if !ok {
		t.Fatalf("refused: %+v", st)
	}
	want := []uint64{8, 998, 17, 994}
	for i, w := range want {
		if !st[i].Allowed || st[i].Remaining != w {
			t.Errorf("state %d: %+v, want allowed, Remaining %d", i, st[i], w)
		}
	}
}

// A decision refused by its leased hits reports its exact takes' buckets
// as they are, taking nothing (they used to read Remaining 0, reset 0, "not
// consulted").
func TestLeasedRefusalReportsExactTakes(t *testing.T) {
	srv := redistest.Start(t)
	l, _ := newLimiter(t, srv, lease.Options{Clock: clockwork.NewFakeClock()})
	a, b := key(t, 0), key(t, 1)
	hourly := bucket.Limit{Requests: 5, Period: 5 * time.Hour, Burst: 5}
	t0 := time.Now()
	if ok, _ := hit(t, l, ruled(take(b, hourly, 2), false)); !ok {
		t.Fatal("the exact take was refused")
	}
	never := ruled(take(a, bucket.Limit{Period: time.Minute}, 1), true)
	ok, st := hit(t, l, never, ruled(take(b, hourly, 1), false))
	if ok || st[0].Allowed {
		t.Fatalf("a leased take of Requests 0: %v %+v, want refused", ok, st)
	}
	tol := time.Since(t0) + time.Millisecond
	if !st[1].Allowed || st[1].Remaining != 3 || st[1].ResetAfter > 2*time.Hour || st[1].ResetAfter < 2*time.Hour-tol {
		t.Errorf("the exact take: %+v, want allowed, Remaining 3, ResetAfter 2h (within %v)", st[1], tol)
	}
	if _, st := hit(t, l, ruled(bucket.Hit{Key: b, Limit: hourly}, false)); st[0].Remaining != 3 {
		t.Errorf("b holds %d tokens, want 3 (nothing taken)", st[0].Remaining)
	}
}

// At the end of the lease period Run gives the unused tokens back; Close
// gives back the rest.
func TestPeriodAndCloseGiveBack(t *testing.T) {
	srv := redistest.Start(t)
	clock := clockwork.NewFakeClock()
	l, r := newLimiter(t, srv, lease.Options{Clock: clock, Period: time.Hour, Tick: time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { l.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	k, k2 := key(t, 0), key(t, 1)
	hit(t, l, take(k, big, 1))
	clock.Advance(30 * time.Minute)
	hit(t, l, take(k2, big, 1))
	if err := clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(40 * time.Minute) // k's period ended, not k2's
	waitFor(t, func() bool { return r.inRedis(t, k, big) == 999 })
	if got := r.inRedis(t, k2, big); got != 500 {
		t.Errorf("k2 (period not over) holds %d tokens in Redis, want 500", got)
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := r.inRedis(t, k2, big); got != 999 {
		t.Errorf("after Close, k2 holds %d tokens in Redis, want 999", got)
	}
}

// When the lease runs below half, Run fetches the next one in the
// background: the requests never wait on Redis.
func TestPrefetch(t *testing.T) {
	srv := redistest.Start(t)
	reg := prometheus.NewRegistry()
	l, r := newLimiter(t, srv, lease.Options{Clock: clockwork.NewFakeClock(), Metrics: lease.NewMetrics(reg)})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { l.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	k := key(t, 0)
	hit(t, l, take(k, big, 1)) // 499 leased, 500 in Redis
	hit(t, l, take(k, big, 250))
	// Below half: the prefetch takes half of Redis' 500.
	waitFor(t, func() bool { return counter(t, reg, "ratelimit_lease_leases_total", "") == 2 })
	if got := r.inRedis(t, k, big); got != 250 {
		t.Errorf("Redis holds %d after the prefetch, want 250", got)
	}
	if got := counter(t, reg, "ratelimit_lease_tokens_total", "leased"); got != 749 {
		t.Errorf("tokens leased: %v, want 499 + 250", got)
	}
	// The take does not wait on Redis (it may start the next prefetch:
	// the decisions metric tells them apart).
	if ok, st := hit(t, l, take(k, big, 400)); !ok || st[0].Remaining != 349 {
		t.Errorf("a take within both leases: %v %+v, want allowed, 349 left", ok, st)
	}
	if got := counter(t, reg, "ratelimit_lease_decisions_total", "lease"); got != 2 {
		t.Errorf("decisions answered from the lease: %v, want 2", got)
	}
	if got := counter(t, reg, "ratelimit_lease_decisions_total", "redis"); got != 1 {
		t.Errorf("decisions that waited on Redis: %v, want 1", got)
	}
}

// counter reads a counter of reg, with the one label value given (or
// none).
func counter(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" || (len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == label) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// Tokens in hand stay usable while Redis is down; past them, Hit fails
// (and the fail-open switch answers).
func TestRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	l, _ := newLimiter(t, srv, lease.Options{Clock: clockwork.NewFakeClock()})
	lim := bucket.Limit{Requests: 21, Period: time.Hour, Burst: 21}
	k := key(t, 0)
	hit(t, l, take(k, lim, 1)) // leases 10
	srv.Kill()
	for i := range 10 {
		if ok, _ := hit(t, l, take(k, lim, 1)); !ok {
			t.Fatalf("take %d from the lease with Redis down: refused", i)
		}
	}
	states := make([]bucket.State, 1)
	if _, err := l.Hit(context.Background(), []bucket.Hit{take(k, lim, 1)}, states); err == nil {
		t.Error("a take past the lease with Redis down: no error")
	}
}

// A lease is at most what the limit refills in one lease period: a limit
// slower than a token per period is never leased.
func TestLeaseBoundedByPeriod(t *testing.T) {
	srv := redistest.Start(t)
	l, r := newLimiter(t, srv, lease.Options{Clock: clockwork.NewFakeClock(), Period: time.Second})
	k, k2 := key(t, 0), key(t, 1)
	hit(t, l, take(k, big, 1)) // 1000/hour: 0.28 per period
	if got := r.inRedis(t, k, big); got != 999 {
		t.Errorf("a limit of 0.28 tokens per period leased %d tokens, want none", 999-got)
	}
	fast := bucket.Limit{Requests: 10, Period: time.Second, Burst: 1000}
	hit(t, l, take(k2, fast, 1)) // 10 per period, far below half of 999
	if got := r.inRedis(t, k2, fast); got < 989 || got > 990 {
		t.Errorf("Redis holds %d of the fast bucket, want 989 (a lease of 10, plus what refilled since)", got)
	}
}

// Three nodes sharing a bucket at twice its rate never admit more than
// burst + rate × T, and admit most of what one exact bucket admits of the
// same calls.
func TestNeverOver(t *testing.T) {
	srv := redistest.Start(t)
	lim := bucket.Limit{Requests: 200, Period: time.Second, Burst: 50}
	k := bucket.SumKey([]byte(t.Name()))
	var nodes []*lease.Limiter
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	for range 3 {
		l, _ := newLimiter(t, srv, lease.Options{Nodes: func() int { return 3 }, Period: 200 * time.Millisecond, Tick: 20 * time.Millisecond})
		nodes = append(nodes, l)
		wg.Go(func() { l.Run(ctx) })
	}
	// All three on one prefix: newLimiter names it after the test.
	const d = 1500 * time.Millisecond
	var admitted atomic.Int64
	var mu sync.Mutex
	var sent []time.Duration // since start, when each call was sent
	start := time.Now()
	var load, calls sync.WaitGroup
	for _, l := range nodes {
		load.Go(func() {
			// Open loop: call n is due n intervals after start and runs on
			// its own goroutine, so a slow answer on a loaded machine delays
			// no other call; a load goroutine scheduled late sends the
			// calls due meanwhile at once (a time.Ticker would drop them),
			// so the offered load stays 2× the rate.
			const every = time.Second / 133 // 400/s over 3 nodes: 2× the rate
			for n := time.Duration(0); n*every < d; n++ {
				time.Sleep(time.Until(start.Add(n * every)))
				mu.Lock()
				sent = append(sent, time.Since(start))
				mu.Unlock()
				calls.Go(func() {
					states := make([]bucket.State, 1)
					dd, err := l.Hit(context.Background(), []bucket.Hit{take(k, lim, 1)}, states)
					if err == nil && dd.Allowed {
						admitted.Add(1)
					}
				})
			}
		})
	}
	load.Wait()
	calls.Wait()
	// Upper bound: T up to the last answer. Lower bound: 90% of what one
	// exact bucket, full at start, admits of the calls at the times they
	// were sent: a test process starved for a while sends nothing
	// meanwhile, and what the bucket refills over its burst then is lost
	// to any limiter (measured: 320 of 436 against burst + rate × T when
	// the last calls went out 430 ms late).
	elapsed := time.Since(start)
	bound := float64(lim.Burst) + 200*elapsed.Seconds()
	exact := exactAdmits(lim, sent)
	got := float64(admitted.Load())
	t.Logf("admitted %v of a bound of %.0f in %v; one exact bucket admits %d of the %d calls sent", got, bound, elapsed, exact, len(sent))
	if got > bound {
		t.Errorf("admitted %v, over burst + rate × T = %.0f", got, bound)
	}
	if got < 0.9*float64(exact) {
		t.Errorf("admitted %v, under 90%% of the %d one exact bucket admits of the same calls", got, exact)
	}
}

// exactAdmits returns how many calls at times at (since a moment the bucket
// was full) one exact bucket of lim admits, each taking one token.
func exactAdmits(lim bucket.Limit, at []time.Duration) int {
	slices.Sort(at)
	rate := float64(lim.Requests) / lim.Period.Seconds()
	tokens, last, n := float64(lim.Burst), time.Duration(0), 0
	for _, a := range at {
		tokens = min(float64(lim.Burst), tokens+rate*(a-last).Seconds())
		last = a
		if tokens >= 1 {
			tokens--
			n++
		}
	}
	return n
}

// waitFor polls cond every 5ms for up to 5 s.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met within 5s")
}

// A decision answered from the lease allocates nothing: leased mode's
// hot path.
func TestFromLeaseAllocs(t *testing.T) {
	srv := redistest.Start(t)
	l, r := newLimiter(t, srv, lease.Options{Clock: clockwork.NewFakeClock()})
	ks := []bucket.Key{key(t, 0), key(t, 1), key(t, 2)}
	hits := []bucket.Hit{take(ks[0], big, 1), take(ks[1], big, 1), take(ks[2], big, 1)}
	states := make([]bucket.State, len(hits))
	ctx := context.Background()
	if _, err := l.Hit(ctx, hits, states); err != nil {
		t.Fatal(err)
	}
	calls := r.calls.Load()
	n := testing.AllocsPerRun(100, func() {
		if d, err := l.Hit(ctx, hits, states); err != nil || !d.Allowed {
			t.Fatalf("Hit: %+v %v", d, err)
		}
	})
	if r.calls.Load() != calls {
		t.Fatalf("%d Redis calls: not answered from the lease", r.calls.Load()-calls)
	}
	if n != 0 {
		t.Errorf("a decision from the lease allocates %v times, want 0", n)
	}
}

// A changed limit: a node that meets a key under a new limit gives its
// held tokens back under the old one first (the bucket still has it), then
// Redis converts the bucket; a node whose bucket another node converted
// since loses its held tokens instead of giving them back (the
// conservative side: a give under the old limit would switch the bucket
// back to the old limit's rate).
func TestLimitChangeGivesBackOrDrops(t *testing.T) {
	srv := redistest.Start(t)
	clock := clockwork.NewFakeClock()
	old := bucket.Limit{Requests: 100, Period: time.Hour, Burst: 100}
	raised := bucket.Limit{Requests: 200, Period: time.Hour, Burst: 200}

	// One node: the give-back keeps the bucket exact.
	a, r := newLimiter(t, srv, lease.Options{Clock: clock})
	k := key(t, 0)
	if ok, st := hit(t, a, take(k, old, 1)); !ok || st[0].Remaining != 99 {
		t.Fatalf("take under the old limit: %v %+v, want allowed, 99 left", ok, st)
	}
	if got := r.inRedis(t, k, old); got != 50 {
		t.Fatalf("Redis holds %d tokens, want 50 (49 leased)", got)
	}
	if ok, st := hit(t, a, take(k, raised, 1)); !ok || st[0].Remaining != 198 {
		t.Fatalf("take under the raised limit: %v %+v, want allowed, 198 left (2 spent)", ok, st)
	}

	// Two nodes: b converts the bucket while a holds a lease of the old
	// limit; a's give-back (Close) then leaves the bucket as it is.
	b, _ := newLimiter(t, srv, lease.Options{Clock: clock})
	k = key(t, 1)
	if ok, _ := hit(t, a, take(k, old, 1)); !ok {
		t.Fatal("a's take refused")
	}
	if ok, st := hit(t, b, take(k, raised, 1)); !ok || st[0].Remaining != 149 {
		t.Fatalf("b's take under the raised limit: %v %+v, want allowed, 149 left (2 spent, 49 held by a)", ok, st)
	}
	before := r.inRedis(t, k, raised)
	if err := a.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Spent 2, b holds its lease: exact mode would leave 200 - 2 - b's
	// lease, and a's 49 tokens are lost rather than risk more.
	if got := r.inRedis(t, k, raised); got != before || before != 200-2-49-74 {
		t.Errorf("Redis holds %d tokens after a's give-back, %d before; want %d both (a's old-limit tokens dropped)", got, before, 200-2-49-74)
	}
}

// A leased bucket's value is token_bucket.lua's layout: four little-endian
// doubles (TAT µs, expiry ms, interval µs and burst of the limit it was
// written under), then, while leases are out, five more (lease.lua's
// count of parked tokens); the 8-byte TAT of earlier builds reads as a
// full bucket.
func TestValueFormat(t *testing.T) {
	srv := redistest.Start(t)
	l, r := newLimiter(t, srv, lease.Options{})
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	k := key(t, 0)
	lim := bucket.Limit{Requests: 10, Period: 10 * time.Second, Burst: 5}
	rkey := fmt.Sprintf("%s:lease:{%x}", t.Name(), k[:])
	old := make([]byte, 8)
	binary.LittleEndian.PutUint64(old, math.Float64bits(1e18)) // a TAT far ahead
	if err := c.Set(ctx, rkey, old, time.Minute).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if got := r.inRedis(t, k, lim); got != lim.Burst {
		t.Errorf("bucket with an 8-byte value: %d tokens, want full (%d)", got, lim.Burst)
	}
	if ok, _ := hit(t, l, take(k, lim, 2)); !ok {
		t.Fatal("take refused")
	}
	v, err := c.Get(ctx, rkey).Bytes()
	if err != nil || len(v) != 72 {
		t.Fatalf("GET after a take and a lease: %d bytes (%v), want 72", len(v), err)
	}
	d := func(i int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(v[8*i:])) }
	if iv, burst := d(2), d(3); iv != 1e6 || burst != float64(lim.Burst) {
		t.Errorf("value records interval %vµs, burst %v; want 1e6µs, %d", iv, burst, lim.Burst)
	}
	// The lease (half of the 3 left: 1) is counted as parked, in a window
	// of twice the lease period (newLimiter's hour).
	if w, start, pstart, cur, prev := d(4), d(5), d(6), d(7), d(8); w != 2*3600e6 || start != pstart || cur != 1 || prev != 0 {
		t.Errorf("value records window %vµs from %v (previous from %v), %v parked now, %v before; want 7.2e9µs, one start, 1, 0", w, start, pstart, cur, prev)
	}
	mem72, err := c.MemoryUsage(ctx, rkey).Result()
	if err != nil {
		t.Fatal(err)
	}
	// Closing the pool (Close gives the lease back) empties the count:
	// the value is 32 bytes again.
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if v, err = c.Get(ctx, rkey).Bytes(); err != nil || len(v) != 32 {
		t.Fatalf("GET after Close: %d bytes (%v), want 32", len(v), err)
	}
	mem32, err := c.MemoryUsage(ctx, rkey).Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("MEMORY USAGE of the key: %d bytes with the count (72-byte value), %d without (32)", mem72, mem32)
	if mem72-mem32 > 64 {
		t.Errorf("the count costs %d bytes of Redis memory per key, want at most 64", mem72-mem32)
	}
	if got := r.inRedis(t, k, lim); got != lim.Burst-2 {
		t.Errorf("after Close, Redis holds %d, want %d", got, lim.Burst-2)
	}
}

// A give (is_negative_hits) while another node holds a lease: exact mode
// clamps the give at the burst, so the fleet (Redis' bucket plus the
// tokens parked in leases) must not hold more after it. Node a leases
// half of what its take leaves, node b gives near full, then both take
// until refused: the fleet admits what the exact backend admits on the
// same sequence, never more.
func TestGiveWhileLeasedNeverOver(t *testing.T) {
	srv := redistest.Start(t)
	// 100 a day: a token refills in 864 s, none within the test.
	lim := bucket.Limit{Requests: 100, Period: 24 * time.Hour, Burst: 100}
	k := key(t, 0)
	give := bucket.Hit{Key: k, Limit: lim, Cost: 60, Give: true}

	// The same sequence on the exact backend (token_bucket.lua): take 1,
	// give 60 (clamped at the burst: 100), then takes until refused.
	drain := func(ls ...bucket.Limiter) int {
		n := 0
		states := make([]bucket.State, 1)
		for _, l := range ls {
			for range 1000 {
				d, err := l.Hit(context.Background(), []bucket.Hit{take(k, lim, 1)}, states)
				if err != nil {
					t.Fatalf("Hit: %v", err)
				}
				if !d.Allowed {
					break
				}
				n++
			}
		}
		return n
	}
	seq := func(first, giver bucket.Limiter, rest ...bucket.Limiter) (admitted int, elapsed time.Duration) {
		start := time.Now()
		states := make([]bucket.State, 1)
		if d, err := first.Hit(context.Background(), []bucket.Hit{take(k, lim, 1)}, states); err != nil || !d.Allowed {
			t.Fatalf("first take: %+v %v", d, err)
		}
		if d, err := giver.Hit(context.Background(), []bucket.Hit{give}, states); err != nil || !d.Allowed {
			t.Fatalf("give: %+v %v", d, err)
		}
		admitted = 1 + drain(rest...)
		return admitted, time.Since(start)
	}

	// A lease period of a day: a lease may be a day's refill (49 here).
	a, r := newLimiter(t, srv, lease.Options{Clock: clockwork.NewFakeClock(), Period: 24 * time.Hour})
	b, _ := newLimiter(t, srv, lease.Options{Clock: clockwork.NewFakeClock(), Period: 24 * time.Hour})
	exact, exactTook := seq(r.Limiter, r.Limiter, r.Limiter)
	if exact != 101 {
		t.Fatalf("exact mode admitted %d, want 1 + 100 (the give clamped at the burst)", exact)
	}
	// a's take leases 49 of the 99 left; b's give comes while a holds them.
	leased, took := seq(a, b, b, a)
	// Refill allowance: what the limit refills in either run, rounded up.
	slack := int(math.Ceil(float64(lim.Requests) * float64(took+exactTook) / float64(lim.Period)))
	t.Logf("exact mode admitted %d in %v, the leased fleet %d in %v (slack %d)", exact, exactTook, leased, took, slack)
	if leased > exact+slack {
		t.Errorf("the leased fleet admitted %d after a give while a lease was out, over exact mode's %d", leased, exact)
	}
	if leased < exact-slack {
		t.Errorf("the leased fleet admitted %d, under exact mode's %d: the give's clamp lost tokens", leased, exact)
	}
}

// lease.lua's count of parked tokens, op by op: a grant counts its lease,
// a give fills the bucket only up to the burst minus the count, a return
// that closes the pool takes its grants out of the count, and a grant
// leaves the count on its own only a window after it.
func TestParkedCount(t *testing.T) {
	srv := redistest.Start(t)
	_, r := newLimiter(t, srv, lease.Options{})
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	lim := bucket.Limit{Requests: 100, Period: 24 * time.Hour, Burst: 100}
	call := func(op leaseproto.Op) leaseproto.Reply {
		t.Helper()
		op.Limit, op.Decision = lim, 1
		out := make([]leaseproto.Reply, 1)
		if err := r.Limiter.Lease(ctx, []leaseproto.Op{op}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	k := key(t, 0)
	leaseOp := leaseproto.Op{Key: k, Kind: leaseproto.Take, Need: 1, Take: 1, Extra: 100, Share: 2, Window: time.Hour}
	g := call(leaseOp)
	if g.Leased != 49 || g.Remaining != 50 || g.Granted == 0 {
		t.Fatalf("take 1 and lease: %+v, want 49 leased, 50 left, a grant time", g)
	}
	if got := call(leaseproto.Op{Key: k, Kind: leaseproto.Give, Take: 60, Window: time.Hour}); got.Remaining != 51 {
		t.Errorf("give 60 with 49 parked: %d left, want 51 (100 - 49)", got.Remaining)
	}
	// The pool goes back: 10 unspent, 39 spent; the count empties.
	if got := call(leaseproto.Op{Key: k, Kind: leaseproto.Return, Take: 10, Window: time.Hour, Since: g.Granted, Unpark: 49}); got.Remaining != 61 {
		t.Errorf("return 10 closing the pool: %d left, want 61", got.Remaining)
	}
	rkey := fmt.Sprintf("%s:lease:{%x}", t.Name(), k[:])
	if v, err := c.Get(ctx, rkey).Bytes(); err != nil || len(v) != 32 {
		t.Errorf("value with nothing parked: %d bytes (%v), want 32", len(v), err)
	}
	if got := call(leaseproto.Op{Key: k, Kind: leaseproto.Give, Take: 60, Window: time.Hour}); got.Remaining != 100 {
		t.Errorf("give 60 with nothing parked: %d left, want 100", got.Remaining)
	}

	// A return whose first grant the count no longer holds takes nothing
	// out: a pool granted before a window that was dropped.
	k = key(t, 1)
	win := 20 * time.Millisecond
	leaseOp.Key, leaseOp.Window = k, win
	g = call(leaseOp)
	if g.Leased != 49 {
		t.Fatalf("take 1 and lease: %+v, want 49 leased", g)
	}
	// Until a window has passed on Redis' clock the lease is counted; a
	// window or two after, it is dropped: poll with gives of 1000.
	for end := time.Now().Add(5 * time.Second); ; {
		got := call(leaseproto.Op{Key: k, Kind: leaseproto.Give, Take: 1000, Window: win})
		tm, err := c.Time(ctx).Result() // after the give: its time is before
		if err != nil {
			t.Fatal(err)
		}
		if uint64(tm.UnixMicro()) < g.Granted+uint64(win/time.Microsecond) && got.Remaining != 51 {
			t.Fatalf("give within a window of the grant: %d left, want 51 (49 parked)", got.Remaining)
		}
		if got.Remaining == 100 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the lease was still counted 5 s after its grant (window %v): %d left", win, got.Remaining)
		}
		time.Sleep(win / 4)
	}
	// The pool's return comes too late to unpark anything: the count is
	// empty, and a second lease's count stays whole.
	g2 := call(leaseOp) // takes 1, leases 49 of 99: 50 left
	if got := call(leaseproto.Op{Key: k, Kind: leaseproto.Return, Take: 0, Window: win, Since: g.Granted, Unpark: 49}); got.Remaining != 50 {
		t.Errorf("a stale return: %d left, want 50", got.Remaining)
	}
	got := call(leaseproto.Op{Key: k, Kind: leaseproto.Give, Take: 1000, Window: win})
	tm, err := c.Time(ctx).Result() // after the give: its time is before
	if err != nil {
		t.Fatal(err)
	}
	if uint64(tm.UnixMicro()) < g2.Granted+uint64(win/time.Microsecond) && got.Remaining != 51 {
		t.Errorf("give after a stale return: %d left, want 51 (the second lease still counted)", got.Remaining)
	}
}

// A node spends a pool's tokens only until one lease period after its
// first grant (Redis counts them as parked that long, and a little
// more): the next decision after it gives them back and closes the pool
// in the same call as its take, even before Run's round does.
func TestPoolEnds(t *testing.T) {
	srv := redistest.Start(t)
	clock := clockwork.NewFakeClock()
	l, r := newLimiter(t, srv, lease.Options{Clock: clock, Period: time.Hour})
	k := key(t, 0)
	hit(t, l, take(k, big, 1)) // leases 499: 500 in Redis
	hit(t, l, take(k, big, 1)) // from the lease
	calls := r.calls.Load()
	clock.Advance(time.Hour)
	if ok, st := hit(t, l, take(k, big, 1)); !ok || st[0].Remaining != 997 {
		t.Fatalf("take after the pool's end: %v %+v, want allowed, 997 left", ok, st)
	}
	if n := r.calls.Load() - calls; n != 1 {
		t.Errorf("take after the pool's end: %d Redis calls, want 1 (the give-back and the take)", n)
	}
	// 498 came back, 1 was taken, and half the rest (498 of 997) leased.
	if got := r.inRedis(t, k, big); got != 499 {
		t.Errorf("Redis holds %d, want 499", got)
	}
}

// A decision refused from the empty-bucket cache gives nothing back: a
// key of it that would have asked Redis keeps its lease.
func TestCachedRefusalKeepsPool(t *testing.T) {
	srv := redistest.Start(t)
	l, r := newLimiter(t, srv, lease.Options{Clock: clockwork.NewFakeClock()})
	a, b := key(t, 0), key(t, 1)
	one := bucket.Limit{Requests: 1, Period: time.Hour, Burst: 1}
	hit(t, l, take(a, big, 1)) // leases 499 of a
	if ok, _ := hit(t, l, take(b, one, 1)); !ok {
		t.Fatal("b's only token refused")
	}
	calls := r.calls.Load()
	if ok, _ := hit(t, l, take(a, big, 600), take(b, one, 1)); ok {
		t.Fatal("a decision with b empty allowed")
	}
	if ok, _ := hit(t, l, take(a, big, 499)); !ok {
		t.Fatal("a's lease refused")
	}
	if n := r.calls.Load() - calls; n != 0 {
		t.Errorf("%d Redis calls, want 0: b refused from the cache, a from its lease", n)
	}
}

// A pool whose key spent some of it is renewed at its end: Run's round
// gives it back and leases the next in one call, so the key's next
// decision is answered from the lease, not from Redis. A pool its key did
// not spend from goes back alone.
func TestRenewAtPoolEnd(t *testing.T) {
	srv := redistest.Start(t)
	clock := clockwork.NewFakeClock()
	reg := prometheus.NewRegistry()
	l, r := newLimiter(t, srv, lease.Options{Clock: clock, Period: time.Hour, Tick: time.Second, Metrics: lease.NewMetrics(reg)})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { l.Run(ctx) })
	defer func() { cancel(); wg.Wait() }()
	busy, idle := key(t, 0), key(t, 1)
	hit(t, l, take(busy, big, 1)) // leases 499: 500 in Redis
	hit(t, l, take(busy, big, 1)) // from the pool
	hit(t, l, take(busy, big, 1)) // from the pool: 497 held
	hit(t, l, take(idle, big, 1)) // leases 499, spends none of it
	if err := clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	calls, leases := r.calls.Load(), counter(t, reg, "ratelimit_lease_leases_total", "")
	clock.Advance(time.Hour) // both pools end
	// busy: 497 back (997), then half of it leased (498): 499 in Redis.
	// Redis holds that before Run has the reply: the lease counted is Run
	// done with it, and busy's next decision must find its new pool.
	waitFor(t, func() bool {
		return r.inRedis(t, idle, big) == 999 && r.inRedis(t, busy, big) == 499 &&
			counter(t, reg, "ratelimit_lease_leases_total", "") == leases+1
	})
	if n := r.calls.Load() - calls; n != 1 {
		t.Errorf("%d Lease calls at the pools' end, want 1 (Run's round)", n)
	}
	waited := counter(t, reg, "ratelimit_lease_decisions_total", "redis")
	if ok, st := hit(t, l, take(busy, big, 1)); !ok || st[0].Remaining != 996 {
		t.Errorf("busy after its renewal: %v %+v, want allowed, 996 left (499 + 497 held)", ok, st)
	}
	if got := counter(t, reg, "ratelimit_lease_decisions_total", "redis") - waited; got != 0 {
		t.Errorf("busy's decision after the renewal waited on Redis (%v), want it answered from the lease", got)
	}
	if ok, _ := hit(t, l, take(idle, big, 1)); !ok {
		t.Error("idle's next take refused")
	}
	if got := counter(t, reg, "ratelimit_lease_decisions_total", "redis") - waited; got != 1 {
		t.Errorf("idle's next decision: %v Redis waits, want 1 (its pool went back alone)", got)
	}
}
