package redis_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	goredis "github.com/redis/go-redis/v9"

	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/internal/redistest"
)

// env is one Redis deployment the behaviour suite runs against.
type env struct {
	// client returns a new client whose script calls are counted in calls.
	client func(t *testing.T, calls *atomic.Int64) goredis.UniversalClient
}

// scriptCounter counts EVALSHA calls, alone or in pipelines: one per script
// call. (An EVAL follows when NOSCRIPT answers, as after the parallel
// NoScript test's SCRIPT FLUSH.)
type scriptCounter struct{ n *atomic.Int64 }

func (scriptCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h scriptCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if cmd.Name() == "evalsha" {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h scriptCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		for _, cmd := range cmds {
			if cmd.Name() == "evalsha" {
				h.n.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

func singleEnv(s *redistest.Server) env { return urlEnv("redis://" + s.Addr()) }

func clusterEnv(cl *redistest.Cluster) env { return urlEnv(strings.Join(cl.Addrs(), ",")) }

// urlEnv builds clients as production does: ParseURL, then
// NewUniversalClient. Tests set their Limiter's timeout; the client's
// backstops follow a generous 1s.
func urlEnv(url string) env {
	return env{client: func(t *testing.T, calls *atomic.Int64) goredis.UniversalClient {
		opts, err := redisbackend.ParseURL(url, time.Second)
		if err != nil {
			t.Fatalf("ParseURL(%q): %v", url, err)
		}
		c := goredis.NewUniversalClient(opts)
		t.Cleanup(func() { _ = c.Close() })
		if calls != nil {
			c.AddHook(scriptCounter{calls})
		}
		return c
	}}
}

// fixture is one test's limiter, with its own key prefix.
type fixture struct {
	t      *testing.T
	l      *redisbackend.Limiter
	client goredis.UniversalClient
	calls  atomic.Int64
	prefix string
}

func (e env) fixture(t *testing.T, opts redisbackend.Options) *fixture {
	f := &fixture{t: t, prefix: strings.NewReplacer("/", "-", "{", "", "}", "").Replace(t.Name())}
	f.client = e.client(t, &f.calls)
	opts.Client = f.client
	if opts.Prefix == "" {
		opts.Prefix = f.prefix
	}
	if opts.Timeout == 0 {
		// Generous under -race on a loaded machine (1s was not: under a CPU
		// hog, BatchingAllOrNothing's 640 queued decisions on a cluster
		// timed out); timeouts have their own tests, with their own.
		opts.Timeout = 10 * time.Second
	}
	if opts.CacheSize == 0 {
		opts.CacheSize = -1 // exercise Redis; the cache has its own tests
	}
	f.l = redisbackend.New(opts)
	t.Cleanup(f.l.Close) // before the client's Close: cleanups run last first
	return f
}

// warm makes one check-only decision on k through a second Limiter on f's
// client, with a generous Timeout: afterwards the script is loaded in Redis
// and a connection is in the client's pool, which f.l shares. Tests of a
// short Timeout warm up this way, so that only the calls under test run
// under it: a first call (dial, HELLO, NOSCRIPT and EVAL) on a busy machine
// under -race can miss a deadline of tens of milliseconds.
func (f *fixture) warm(k bucket.Key, lim bucket.Limit) {
	f.t.Helper()
	l := redisbackend.New(redisbackend.Options{Client: f.client, Prefix: f.prefix, Timeout: 10 * time.Second, CacheSize: -1})
	defer l.Close()
	if _, err := l.Hit(context.Background(), []bucket.Hit{{Key: k, Limit: lim, Cost: 0}}, make([]bucket.State, 1)); err != nil {
		f.t.Fatalf("warm-up with a 10s timeout: %v", err)
	}
}

// key derives a bucket key from the test name and n.
func (f *fixture) key(n int) bucket.Key {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s/%d", f.t.Name(), n))
	return bucket.Key(sum[:16])
}

// hit runs one decision and fails the test on error.
func (f *fixture) hit(hits ...bucket.Hit) (bool, []bucket.State) {
	f.t.Helper()
	states := make([]bucket.State, len(hits))
	d, err := f.l.Hit(context.Background(), hits, states)
	ok := d.Allowed
	if err != nil {
		f.t.Fatalf("Hit(%+v): %v", hits, err)
	}
	return ok, states
}

// remaining checks bucket k's whole tokens without taking any.
func (f *fixture) remaining(k bucket.Key, lim bucket.Limit) uint64 {
	f.t.Helper()
	_, st := f.hit(bucket.Hit{Key: k, Limit: lim, Cost: 0})
	return st[0].Remaining
}

// slow is a limit whose refill is negligible during a test: one token per
// second, five at most.
var slow = bucket.Limit{Requests: 3600, Period: time.Hour, Burst: 5}

// hourly is slow at one token per hour: tests that count whole tokens over
// several calls use it, since a loaded machine can spend a second between
// two calls, and slow then refills a token.
var hourly = bucket.Limit{Requests: 1, Period: time.Hour, Burst: 5}

// elapsed returns a tolerance for the times Redis reports for a bucket
// whose state was set at or after t0: Redis' clock has moved at most the
// local time since t0 (both are the machine's), plus a millisecond of
// rounding. A fixed tolerance (100ms) failed on a loaded machine, where
// five calls can take longer.
func elapsed(t0 time.Time) time.Duration { return time.Since(t0) + time.Millisecond }

// behaviours is the suite run on a single Redis and on a cluster.
var behaviours = []struct {
	name string
	run  func(t *testing.T, e env)
}{
	{"Burst", testBurst},
	{"Refill", testRefill},
	{"CostAndCheckOnly", testCostAndCheckOnly},
	{"CostAboveBurst", testCostAboveBurst},
	{"AllOrNothing", testAllOrNothing},
	{"DuplicateKeys", testDuplicateKeys},
	{"Independent", testIndependent},
	{"Give", testGive},
	{"RequestsZero", testRequestsZero},
	{"TTL", testTTL},
	{"NoScript", testNoScript},
	{"EmptyCache", testEmptyCache},
	{"EmptyCacheAllOrNothing", testEmptyCacheAllOrNothing},
	{"EmptyCacheLimitChange", testEmptyCacheLimitChange},
	{"BeyondLoweredBurst", testBeyondLoweredBurst},
	{"ValueFormat", testValueFormat},
	{"Concurrent", testConcurrent},
	{"ManyHits", testManyHits},
	{"Batching", testBatching},
	{"BatchingAllOrNothing", testBatchingAllOrNothing},
	{"LoneRequest", testLoneRequest},
}

func runBehaviours(t *testing.T, e env) {
	for _, b := range behaviours {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			b.run(t, e)
		})
	}
}

func TestSingle(t *testing.T) {
	t.Parallel()
	runBehaviours(t, singleEnv(redistest.Start(t)))
}

func testBurst(t *testing.T, e env) {
	f := e.fixture(t, redisbackend.Options{})
	k := f.key(0)
	per := hourly.Period / time.Duration(hourly.Requests) // one token
	t0 := time.Now()
	for want := uint64(4); ; want-- {
		ok, st := f.hit(bucket.Hit{Key: k, Limit: hourly, Cost: 1})
		if !ok || !st[0].Allowed || st[0].Remaining != want || st[0].RetryAfter != 0 {
			t.Fatalf("hit leaving %d: got %v %+v, want allowed, Remaining %d, no RetryAfter", want, ok, st[0], want)
		}
		if wantReset := time.Duration(5-want) * per; !near(st[0].ResetAfter, wantReset, elapsed(t0)) {
			t.Errorf("hit leaving %d: ResetAfter %v, want %v less the time since the first hit (at most %v)", want, st[0].ResetAfter, wantReset, elapsed(t0))
		}
		if want == 0 {
			break
		}
	}
	ok, st := f.hit(bucket.Hit{Key: k, Limit: hourly, Cost: 1})
	if ok || st[0].Allowed || st[0].Remaining != 0 {
		t.Fatalf("hit on an empty bucket: got %v %+v, want refused, Remaining 0", ok, st[0])
	}
	if tol := elapsed(t0); !near(st[0].RetryAfter, per, tol) || !near(st[0].ResetAfter, 5*per, tol) {
		t.Errorf("hit on an empty bucket: RetryAfter %v ResetAfter %v, want %v and %v less the time since the first hit (at most %v)",
			st[0].RetryAfter, st[0].ResetAfter, per, 5*per, tol)
	}
}

// near reports whether got is within tol below want (and not above it):
// Redis time only moves forward between the call and the check.
func near(got, want, tol time.Duration) bool { return got <= want && got >= want-tol }

func testRefill(t *testing.T, e env) {
	f := e.fixture(t, redisbackend.Options{})
	// Drain a bucket and hit it again. Redis' clock (the script reads
	// TIME) moves between the two calls at most the local time from
	// sending the first to the second's answer: only when that is under a
	// token's period must the second be refused. A loaded machine can
	// pause longer; then the try says nothing, and the next doubles the
	// period, on a fresh key.
	var (
		k     bucket.Key
		lim   bucket.Limit
		asked time.Time // Redis reckons RetryAfter from a moment after this
		ok    bool
		st    []bucket.State
	)
	for try, period := 0, 50*time.Millisecond; ; try, period = try+1, 2*period {
		if period > 5*time.Second {
			t.Fatalf("a drain and a hit never took less than a token's period, up to %v", period/2)
		}
		k, lim = f.key(try), bucket.Limit{Requests: 1, Period: period, Burst: 2}
		drained := time.Now()
		f.hit(bucket.Hit{Key: k, Limit: lim, Cost: 2})
		asked = time.Now()
		ok, st = f.hit(bucket.Hit{Key: k, Limit: lim, Cost: 1})
		if time.Since(drained) < period {
			break
		}
		t.Logf("a drain and a hit took %v, not under the period %v: trying %v", time.Since(drained), period, 2*period)
	}
	if ok || st[0].RetryAfter <= 0 || st[0].RetryAfter > lim.Period {
		t.Fatalf("hit on an empty bucket: got %v %+v, want refused with 0 < RetryAfter <= %v", ok, st[0], lim.Period)
	}
	retry := st[0].RetryAfter
	wait := 5*time.Second + 2*lim.Period // generous: two tokens' refill
	deadline := time.Now().Add(wait)
	for {
		ok, st = f.hit(bucket.Hit{Key: k, Limit: lim, Cost: 1})
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no token within %v of a refusal with RetryAfter %v", wait, retry)
		}
		time.Sleep(time.Millisecond) // poll interval, bounded by the deadline
	}
	if waited := time.Since(asked); waited < retry-2*time.Millisecond {
		t.Errorf("token available %v after asking, RetryAfter said %v", waited, retry)
	}
	// A poll answered within a period of the first token finds only it. (On
	// a loaded machine a poll can come later, and find the second too.)
	if time.Since(asked) < retry+lim.Period && st[0].Remaining != 0 {
		t.Errorf("first token after a refill: Remaining %d, want 0", st[0].Remaining)
	}
	// Full again after one period more than the two tokens need.
	deadline = time.Now().Add(wait)
	for f.remaining(k, lim) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("bucket not full within %v", wait)
		}
		time.Sleep(time.Millisecond) // poll interval, bounded by the deadline
	}
}

func testCostAndCheckOnly(t *testing.T, e env) {
	f := e.fixture(t, redisbackend.Options{})
	k := f.key(0)
	per := hourly.Period / time.Duration(hourly.Requests) // one token
	steps := []struct {
		cost             uint64
		charge           bool // an independent take that overdraws
		wantAllowed      bool
		wantStateRefused bool // a charge: the call allowed, its state refused
		wantRemaining    uint64
		wantRetry        time.Duration // approximately
	}{
		{cost: 3, wantAllowed: true, wantRemaining: 2},
		{cost: 0, wantAllowed: true, wantRemaining: 2},
		{cost: 3, wantAllowed: false, wantRemaining: 2, wantRetry: per},
		{cost: 2, wantAllowed: true, wantRemaining: 0},
		// Empty is not in debt: a check passes.
		{cost: 0, wantAllowed: true, wantRemaining: 0},
		{cost: 2, wantAllowed: false, wantRemaining: 0, wantRetry: 2 * per},
		// A charge past the limit: one token of debt, which refuses checks.
		{cost: 1, charge: true, wantAllowed: true, wantStateRefused: true, wantRemaining: 0, wantRetry: 2 * per},
		{cost: 0, wantAllowed: false, wantRemaining: 0, wantRetry: per},
	}
	t0 := time.Now()
	for i, s := range steps {
		ok, st := f.hit(bucket.Hit{Key: k, Limit: hourly, Cost: s.cost, Independent: s.charge, Overdraw: s.charge})
		if ok != s.wantAllowed || st[0].Allowed != (s.wantAllowed && !s.wantStateRefused) || st[0].Remaining != s.wantRemaining ||
			!near(st[0].RetryAfter, s.wantRetry, elapsed(t0)) {
			t.Errorf("step %d, cost %d: got %v %+v, want allowed %v, Remaining %d, RetryAfter ≈ %v",
				i, s.cost, ok, st[0], s.wantAllowed, s.wantRemaining, s.wantRetry)
		}
	}
}

func testCostAboveBurst(t *testing.T, e env) {
	f := e.fixture(t, redisbackend.Options{})
	k := f.key(0)
	per := hourly.Period / time.Duration(hourly.Requests) // one token
	t0 := time.Now()
	f.hit(bucket.Hit{Key: k, Limit: hourly, Cost: 2})
	ok, st := f.hit(bucket.Hit{Key: k, Limit: hourly, Cost: 6})
	if ok || st[0].Allowed || st[0].Remaining != 3 {
		t.Fatalf("cost 6 > burst 5: got %v %+v, want refused with Remaining 3", ok, st[0])
	}
	if st[0].RetryAfter != st[0].ResetAfter || !near(st[0].ResetAfter, 2*per, elapsed(t0)) {
		t.Errorf("cost above burst: RetryAfter %v ResetAfter %v, want both ≈ %v (until full)", st[0].RetryAfter, st[0].ResetAfter, 2*per)
	}
	if got := f.remaining(k, hourly); got != 3 {
		t.Errorf("after a refused cost above burst: Remaining %d, want 3", got)
	}
}

func testAllOrNothing(t *testing.T, e env) {
	f := e.fixture(t, redisbackend.Options{})
	a, b, c := f.key(0), f.key(1), f.key(2)
	f.hit(bucket.Hit{Key: b, Limit: hourly, Cost: 5})
	ok, st := f.hit(
		bucket.Hit{Key: a, Limit: hourly, Cost: 2},
		bucket.Hit{Key: b, Limit: hourly, Cost: 1},
		bucket.Hit{Key: c, Limit: hourly, Cost: 1},
	)
	if ok {
		t.Fatalf("decision with an empty bucket: allowed, want refused")
	}
	if !st[0].Allowed || st[0].Remaining != 5 || st[1].Allowed || !st[2].Allowed || st[2].Remaining != 5 {
		t.Errorf("states %+v, want [allowed with 5 left (untouched), refused, allowed with 5 left]", st)
	}
	if got := f.remaining(a, hourly); got != 5 {
		t.Errorf("bucket a after a refused decision: %d tokens, want 5 (nothing taken)", got)
	}
	if got := f.remaining(c, hourly); got != 5 {
		t.Errorf("bucket c after a refused decision: %d tokens, want 5 (nothing taken)", got)
	}
	ok, st = f.hit(
		bucket.Hit{Key: a, Limit: hourly, Cost: 2},
		bucket.Hit{Key: c, Limit: hourly, Cost: 1},
	)
	if !ok || st[0].Remaining != 3 || st[1].Remaining != 4 {
		t.Errorf("decision with tokens: %v %+v, want allowed with 3 and 4 left", ok, st)
	}
}

func testDuplicateKeys(t *testing.T, e env) {
	f := e.fixture(t, redisbackend.Options{})
	k := f.key(0)
	ok, st := f.hit(bucket.Hit{Key: k, Limit: hourly, Cost: 2}, bucket.Hit{Key: k, Limit: hourly, Cost: 2})
	if !ok || st[0].Remaining != 3 || st[1].Remaining != 1 {
		t.Fatalf("two hits on one bucket: %v %+v, want allowed with 3 then 1 left", ok, st)
	}
	ok, st = f.hit(bucket.Hit{Key: k, Limit: hourly, Cost: 1}, bucket.Hit{Key: k, Limit: hourly, Cost: 1})
	if ok || !st[0].Allowed || st[1].Allowed {
		t.Fatalf("two hits on a bucket with one token: %v %+v, want refused (second hit)", ok, st)
	}
	if got := f.remaining(k, hourly); got != 1 {
		t.Errorf("after the refusal: %d tokens, want 1", got)
	}
}

func testIndependent(t *testing.T, e env) {
	f := e.fixture(t, redisbackend.Options{})
	a, b := f.key(0), f.key(1)
	f.hit(bucket.Hit{Key: b, Limit: hourly, Cost: 5})
	// An independent hit takes its tokens though the decision is refused...
	ok, st := f.hit(
		bucket.Hit{Key: a, Limit: hourly, Cost: 1, Independent: true},
		bucket.Hit{Key: b, Limit: hourly, Cost: 1},
	)
	if ok || !st[0].Allowed || st[0].Remaining != 4 || st[1].Allowed {
		t.Fatalf("independent + empty: %v %+v, want refused, independent allowed with 4 left", ok, st)
	}
	// ...and, refused itself, never blocks the others.
	ok, st = f.hit(
		bucket.Hit{Key: b, Limit: hourly, Cost: 1, Independent: true},
		bucket.Hit{Key: a, Limit: hourly, Cost: 1},
	)
	if !ok || st[0].Allowed || !st[1].Allowed || st[1].Remaining != 3 {
		t.Fatalf("empty independent + take: %v %+v, want allowed, independent refused, 3 left", ok, st)
	}
}

func testGive(t *testing.T, e env) {
	f := e.fixture(t, redisbackend.Options{})
	k := f.key(0)
	f.hit(bucket.Hit{Key: k, Limit: hourly, Cost: 4})
	steps := []struct {
		cost uint64
		want uint64
	}{{2, 3}, {10, 5}, {1, 5}}
	for i, s := range steps {
		ok, st := f.hit(bucket.Hit{Key: k, Limit: hourly, Cost: s.cost, Give: true})
		if !ok || !st[0].Allowed || st[0].Remaining != s.want {
			t.Errorf("step %d, give %d: got %v %+v, want allowed with %d left", i, s.cost, ok, st[0], s.want)
		}
	}
	// Gives are applied even when the decision is refused.
	b := f.key(1)
	f.hit(bucket.Hit{Key: b, Limit: hourly, Cost: 5})
	f.hit(bucket.Hit{Key: k, Limit: hourly, Cost: 3})
	ok, st := f.hit(
		bucket.Hit{Key: k, Limit: hourly, Cost: 1, Give: true},
		bucket.Hit{Key: b, Limit: hourly, Cost: 1},
	)
	if ok || !st[0].Allowed || st[0].Remaining != 3 {
		t.Errorf("give + refused take: %v %+v, want refused, give applied (3 left)", ok, st)
	}
}

func testRequestsZero(t *testing.T, e env) {
	f := e.fixture(t, redisbackend.Options{})
	zero := bucket.Limit{Requests: 0, Period: time.Second}
	for _, cost := range []uint64{0, 1} {
		ok, st := f.hit(bucket.Hit{Key: f.key(0), Limit: zero, Cost: cost},
			bucket.Hit{Key: f.key(1), Limit: slow, Cost: 1})
		if ok || st[0].Allowed || st[0].RetryAfter != time.Second {
			t.Errorf("Requests 0, cost %d: %v %+v, want refused with RetryAfter 1s", cost, ok, st)
		}
		// The other take reports its bucket, untouched (one script call).
		if !st[1].Allowed || st[1].Remaining != 5 || st[1].ResetAfter != 0 {
			t.Errorf("Requests 0, cost %d: other take %+v, want allowed, Remaining 5, ResetAfter 0", cost, st[1])
		}
	}
	if n := f.calls.Load(); n != 2 {
		t.Errorf("Requests 0: %d script calls, want 2 (the other takes reported)", n)
	}
	before := f.calls.Load()
	if ok, _ := f.hit(bucket.Hit{Key: f.key(0), Limit: zero, Cost: 1}); ok {
		t.Errorf("Requests 0 alone: allowed")
	}
	if n := f.calls.Load() - before; n != 0 {
		t.Errorf("Requests 0 alone: %d script calls, want 0", n)
	}
	if got := f.remaining(f.key(1), slow); got != 5 {
		t.Errorf("the other bucket: %d tokens, want 5 (nothing taken)", got)
	}
}

func testTTL(t *testing.T, e env) {
	f := e.fixture(t, redisbackend.Options{})
	ctx := context.Background()
	lim := slow
	pttl := func(k bucket.Key) time.Duration {
		t.Helper()
		key := redisKey(f.prefix, k)
		d, err := f.client.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatalf("PTTL %s: %v", key, err)
		}
		return d
	}
	// The TTL rule: a key outlives its bucket's refill by at most 1 s.
	const slack = time.Second
	for i, cost := range []uint64{1, 3, 5} {
		k := f.key(i)
		_, st := f.hit(bucket.Hit{Key: k, Limit: lim, Cost: cost})
		got := pttl(k)
		want := time.Duration(cost) * time.Second
		if !near(st[0].ResetAfter, want, 200*time.Millisecond) || got < st[0].ResetAfter-5*time.Millisecond || got > st[0].ResetAfter+slack+5*time.Millisecond {
			t.Errorf("cost %d: PTTL %v, want ResetAfter %v (≈ %v) up to %v more", cost, got, st[0].ResetAfter, want, slack)
		}
	}
	// A write whose refill ends before the key's expiry keeps the TTL; one
	// that ends after it sets a new one.
	k := f.key(0) // 1 token taken: full in 1 s, the key lives 2 s
	beforeAt := time.Now()
	before := pttl(k)
	_, st := f.hit(bucket.Hit{Key: k, Limit: lim, Cost: 1, Give: true})
	if !st[0].Allowed || st[0].ResetAfter != 0 {
		t.Fatalf("give back: %+v, want allowed and full", st[0])
	}
	if got := pttl(k); got > before || got < before-elapsed(beforeAt) {
		t.Errorf("after a give: PTTL %v, want kept (%v)", got, before)
	}
	_, st = f.hit(bucket.Hit{Key: k, Limit: lim, Cost: 4})
	if got := pttl(k); got < st[0].ResetAfter-5*time.Millisecond || got > st[0].ResetAfter+slack+5*time.Millisecond || got <= before {
		t.Errorf("after taking 4: PTTL %v, want a new TTL of ResetAfter %v up to %v more", got, st[0].ResetAfter, slack)
	}

	// A check-only hit writes nothing; a refilled bucket's key expires.
	k = f.key(10)
	f.hit(bucket.Hit{Key: k, Limit: lim, Cost: 0})
	if n, err := f.client.Exists(ctx, redisKey(f.prefix, k)).Result(); err != nil || n != 0 {
		t.Errorf("check-only on a new bucket: EXISTS = %d, %v; want 0", n, err)
	}
	fast := bucket.Limit{Requests: 1, Period: 20 * time.Millisecond, Burst: 1}
	f.hit(bucket.Hit{Key: k, Limit: fast, Cost: 1})
	// The slack of a bucket that refills in 20 ms is at most 20 ms: short-
	// lived keys stay short-lived (a flat second made Redis expire them in
	// bulk, blocking it for milliseconds).
	if got := pttl(k); got > 45*time.Millisecond {
		t.Errorf("bucket refilling in 20ms: PTTL %v, want at most 40ms", got)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, err := f.client.Exists(ctx, redisKey(f.prefix, k)).Result()
		if err != nil {
			t.Fatalf("EXISTS: %v", err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("key of a 20ms bucket still exists after 5s")
		}
		time.Sleep(time.Millisecond) // poll interval, bounded by the deadline
	}
}

// redisKey is the documented key layout: "<prefix>:{<hex of the key>}".
func redisKey(prefix string, k bucket.Key) string {
	return fmt.Sprintf("%s:{%x}", prefix, k[:])
}

func testNoScript(t *testing.T, e env) {
	f := e.fixture(t, redisbackend.Options{})
	k := f.key(0)
	f.hit(bucket.Hit{Key: k, Limit: hourly, Cost: 1})
	flushScripts(t, f.client)
	ok, st := f.hit(bucket.Hit{Key: k, Limit: hourly, Cost: 1})
	if !ok || st[0].Remaining != 3 {
		t.Errorf("after SCRIPT FLUSH: %v %+v, want allowed with 3 left", ok, st[0])
	}
}

func flushScripts(t *testing.T, c goredis.UniversalClient) {
	t.Helper()
	ctx := context.Background()
	var err error
	if cc, ok := c.(*goredis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, m *goredis.Client) error {
			return m.ScriptFlush(ctx).Err()
		})
	} else {
		err = c.ScriptFlush(ctx).Err()
	}
	if err != nil {
		t.Fatalf("SCRIPT FLUSH: %v", err)
	}
}

func testEmptyCache(t *testing.T, e env) {
	clk := clockwork.NewFakeClockAt(time.Unix(1_000_000, 0))
	f := e.fixture(t, redisbackend.Options{Clock: clk, CacheSize: 1000})
	k := f.key(0)
	lim := bucket.Limit{Requests: 1, Period: 10 * time.Second, Burst: 2}
	take := bucket.Hit{Key: k, Limit: lim, Cost: 1}

	t0 := time.Now() // the cache's times are Redis', from the second take
	f.hit(take)
	if ok, st := f.hit(take); !ok || st[0].Remaining != 0 {
		t.Fatalf("second token: %v %+v, want allowed, 0 left", ok, st[0])
	}
	// A check goes to Redis, and passes: empty is not in debt.
	before := f.calls.Load()
	if ok, st := f.hit(bucket.Hit{Key: k, Limit: lim}); !ok || !st[0].Allowed {
		t.Errorf("check of a known-empty bucket: %v %+v, want allowed", ok, st[0])
	}
	if n := f.calls.Load() - before; n != 1 {
		t.Errorf("check of a known-empty bucket: %d script calls, want 1", n)
	}
	before = f.calls.Load()
	clk.Advance(2 * time.Second)
	for _, cost := range []uint64{1, 2} {
		ok, st := f.hit(bucket.Hit{Key: k, Limit: lim, Cost: cost})
		wantRetry := 8*time.Second + time.Duration(cost-1)*10*time.Second
		if tol := elapsed(t0); ok || st[0].Allowed || st[0].Remaining != 0 || !near(st[0].RetryAfter, wantRetry, tol) ||
			!near(st[0].ResetAfter, 18*time.Second, tol) {
			t.Errorf("cost %d on a known-empty bucket: %v %+v, want refused, RetryAfter %v and ResetAfter 18s less the time since the first take (at most %v)",
				cost, ok, st[0], wantRetry, tol)
		}
	}
	if n := f.calls.Load() - before; n != 0 {
		t.Errorf("hits on a known-empty bucket made %d script calls, want 0", n)
	}

	// An independent hit still goes to Redis.
	f.hit(bucket.Hit{Key: k, Limit: lim, Cost: 1, Independent: true})
	if n := f.calls.Load() - before; n != 1 {
		t.Errorf("independent hit on a known-empty bucket: %d script calls, want 1", n)
	}

	// Once the next token is due on the node's clock, Redis decides again
	// (and, its own clock not having moved, refuses and refreshes the entry).
	clk.Advance(8 * time.Second)
	before = f.calls.Load()
	if ok, _ := f.hit(take); ok {
		t.Errorf("hit after the cache entry expired: allowed, want refused by Redis")
	}
	if n := f.calls.Load() - before; n != 1 {
		t.Errorf("hit after the cache entry expired: %d script calls, want 1", n)
	}

	// A give from this node forgets the bucket.
	f.hit(bucket.Hit{Key: k, Limit: lim, Cost: 1, Give: true})
	before = f.calls.Load()
	if ok, st := f.hit(take); !ok {
		t.Errorf("hit after a give: %v %+v, want allowed", ok, st[0])
	}
	if n := f.calls.Load() - before; n != 1 {
		t.Errorf("hit after a give: %d script calls, want 1", n)
	}
}

func testEmptyCacheAllOrNothing(t *testing.T, e env) {
	f := e.fixture(t, redisbackend.Options{CacheSize: 1000})
	empty, other := f.key(0), f.key(1)
	f.hit(bucket.Hit{Key: empty, Limit: hourly, Cost: 5})
	t0 := time.Now()
	f.hit(bucket.Hit{Key: other, Limit: hourly, Cost: 2})
	// A refusal of one known-empty take costs no script call.
	before := f.calls.Load()
	if ok, st := f.hit(bucket.Hit{Key: empty, Limit: hourly, Cost: 1}); ok || st[0].Allowed {
		t.Errorf("take of a known-empty bucket: %v %+v, want refused", ok, st)
	}
	if n := f.calls.Load() - before; n != 0 {
		t.Errorf("take of a known-empty bucket: %d script calls, want 0", n)
	}
	// With another take, the refused decision reports that take's bucket
	// as it is: what a check of it says, nothing taken. (It used to report
	// Remaining 0 and reset 0, "not consulted".)
	before = f.calls.Load()
	ok, st := f.hit(
		bucket.Hit{Key: other, Limit: hourly, Cost: 1},
		bucket.Hit{Key: empty, Limit: hourly, Cost: 1},
	)
	if ok || !st[0].Allowed || st[1].Allowed {
		t.Errorf("decision with a known-empty bucket: %v %+v, want refused, the other allowed", ok, st)
	}
	if st[0].Remaining != 3 || st[0].RetryAfter != 0 {
		t.Errorf("other take's state %+v, want Remaining 3 (untouched), RetryAfter 0", st[0])
	}
	if want, tol := 2*time.Hour, elapsed(t0); st[0].ResetAfter > want || st[0].ResetAfter < want-tol {
		t.Errorf("other take's ResetAfter %v, want %v within %v", st[0].ResetAfter, want, tol)
	}
	if n := f.calls.Load() - before; n != 1 {
		t.Errorf("decision with a known-empty bucket and another take: %d script calls, want 1", n)
	}
	if got := f.remaining(other, hourly); got != 3 {
		t.Errorf("other bucket: %d tokens, want 3", got)
	}
}

func testConcurrent(t *testing.T, e env) {
	f := e.fixture(t, redisbackend.Options{})
	lim := bucket.Limit{Requests: 1, Period: time.Hour, Burst: 50}
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			for range 10 {
				states := make([]bucket.State, 2)
				d, err := f.l.Hit(context.Background(), []bucket.Hit{
					{Key: f.key(0), Limit: lim, Cost: 1},
					{Key: f.key(1), Limit: lim, Cost: 1},
				}, states)
				ok := d.Allowed
				if err != nil {
					t.Errorf("Hit: %v", err)
					return
				}
				if ok {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	// No token is lost or made: each one is taken by an allowed decision or
	// still in its bucket. On one Redis all 50 are taken; across cluster
	// slots, two decisions racing for the last tokens of two buckets can both
	// be refused and refunded (never both allowed), leaving tokens behind.
	got := allowed.Load()
	for i := range 2 {
		if left := f.remaining(f.key(i), lim); uint64(got)+left != 50 {
			t.Errorf("bucket %d: %d allowed + %d left, want 50", i, got, left)
		}
	}
	if _, cluster := f.client.(*goredis.ClusterClient); !cluster && got != 50 {
		t.Errorf("200 concurrent decisions on buckets of 50: %d allowed, want 50", got)
	}
}

func TestKeyLayout(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	f := singleEnv(s).fixture(t, redisbackend.Options{Prefix: "a{b}c"})
	var k bucket.Key
	copy(k[:], "{x}{y}}}{{abcdef")
	f.hit(bucket.Hit{Key: k, Limit: slow, Cost: 1})
	keys, err := f.client.Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatalf("KEYS: %v", err)
	}
	want := fmt.Sprintf("a_b_c:{%x}", k[:])
	if len(keys) != 1 || keys[0] != want {
		t.Errorf("keys %q, want [%q]: braces in the prefix become '_', the hash is the only hash tag", keys, want)
	}
	// Keys differing in one bit are different buckets.
	k2 := k
	k2[15] ^= 1
	if got := f.remaining(k2, slow); got != 5 {
		t.Errorf("neighbour bucket: %d tokens, want 5", got)
	}
}

// TestTimeout: on a stalled Redis, Hit fails with a timeout at the Timeout.
// Only the calls under test run under the short Timeout: the warm-up goes
// through a Limiter with a generous one (warm), since a first call (dial,
// HELLO, script load) on a busy machine under -race can take longer than
// 20ms. The latency bound is a baseline measured in the same run: a timer of
// the same length started with each Hit, so that a machine too busy to wake
// goroutines on time delays both alike.
func TestTimeout(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	const timeout = 20 * time.Millisecond
	f := singleEnv(s).fixture(t, redisbackend.Options{Timeout: timeout})
	k := f.key(0)
	f.warm(k, slow)
	s.Stall()
	defer s.Resume()
	for range 3 {
		start := time.Now()
		baseline := make(chan time.Duration, 1)
		go func() {
			<-time.After(timeout)
			baseline <- time.Since(start)
		}()
		states := make([]bucket.State, 1)
		d, err := f.l.Hit(context.Background(), []bucket.Hit{{Key: k, Limit: slow, Cost: 1}}, states)
		ok := d.Allowed
		took := time.Since(start)
		base := <-baseline
		if ok || !errors.Is(err, context.DeadlineExceeded) || redisbackend.ErrorKind(err) != redisbackend.KindTimeout {
			t.Fatalf("Hit on a stalled Redis: %v, %v (kind %q); want an error wrapping context.DeadlineExceeded, kind timeout",
				ok, err, redisbackend.ErrorKind(err))
		}
		if took < timeout {
			t.Errorf("Hit on a stalled Redis gave up after %v, before its %v timeout", took, timeout)
		}
		if took > base+150*time.Millisecond {
			t.Errorf("Hit on a stalled Redis took %v, want ≈ the %v timeout (a %v timer started with it fired after %v)",
				took, timeout, timeout, base)
		}
	}
	s.Resume()
	waitHitOK(t, f.l, k, slow)
}

// TestCallerDeadlineDoesNotCutCall: a script call runs under the Timeout,
// not under its caller's deadline. A caller whose deadline passes while
// Redis is stalled gets the decision once Redis answers, within the
// Timeout, instead of a failed call (which the fail-open switch (package fallback) would count against
// Redis, and which would drop the connection).
func TestCallerDeadlineDoesNotCutCall(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	f := singleEnv(s).fixture(t, redisbackend.Options{Timeout: 10 * time.Second})
	k := f.key(0)
	lim := bucket.Limit{Requests: 5, Period: 24 * time.Hour, Burst: 5} // no refill during the test
	f.hit(bucket.Hit{Key: k, Limit: lim, Cost: 1})                     // connection warm; 4 left
	s.Stall()
	defer s.Resume()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	type result struct {
		ok    bool
		err   error
		state bucket.State
	}
	done := make(chan result, 1)
	go func() {
		states := make([]bucket.State, 1)
		d, err := f.l.Hit(ctx, []bucket.Hit{{Key: k, Limit: lim, Cost: 1}}, states)
		ok := d.Allowed
		done <- result{ok, err, states[0]}
	}()
	<-ctx.Done() // the caller's deadline has passed with Redis stalled
	s.Resume()
	select {
	case r := <-done:
		if r.err != nil || !r.ok || r.state.Remaining != 3 {
			t.Errorf("Hit whose caller's deadline passed during the call: %v %v %+v; want the decision from Redis, allowed with 3 left", r.ok, r.err, r.state)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Hit did not return within 15s (Timeout 10s)")
	}
	// A caller already gone is not sent to Redis.
	states := make([]bucket.State, 1)
	if _, err := f.l.Hit(ctx, []bucket.Hit{{Key: k, Limit: lim, Cost: 1}}, states); !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, redisbackend.ErrAbandoned) {
		t.Errorf("Hit with a context already done: %v, want its error and ErrAbandoned", err)
	}
	if got := f.remaining(k, lim); got != 3 {
		t.Errorf("bucket has %d tokens after the call of a caller already gone, want 3 (not sent)", got)
	}
}

// TestStallCallersGone: on a stalled Redis, a caller whose deadline is
// shorter than the Timeout still gets Redis' own timeout when its call was
// in flight (not ErrAbandoned: Redis failed, and the fail-open switch must
// count it), while a caller that gave up in the queue gets ErrAbandoned.
func TestStallCallersGone(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	// The second caller must queue while the first call is in flight: a
	// Timeout of 1s leaves a busy machine ample time to start it.
	const timeout = time.Second
	f := singleEnv(s).fixture(t, redisbackend.Options{Timeout: timeout})
	k := f.key(0)
	f.warm(k, slow)
	s.Stall()
	defer s.Resume()
	errs := make(chan error, 2)
	hit := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		_, err := f.l.Hit(ctx, []bucket.Hit{{Key: k, Limit: slow, Cost: 1}}, make([]bucket.State, 1))
		errs <- err
	}
	// The first caller's call is in flight (the one writer slot busy);
	// the second queues behind it.
	sent := &sentHook{ch: make(chan struct{}, 1)}
	f.client.AddHook(sent)
	go hit()
	select {
	case <-sent.ch: // the first call has reached the client
	case <-time.After(10 * time.Second):
		t.Fatal("no script call within 10s")
	}
	go hit()
	var abandoned, own int
	for range 2 {
		err := <-errs
		switch {
		case errors.Is(err, redisbackend.ErrAbandoned):
			abandoned++
		case errors.Is(err, context.DeadlineExceeded) && redisbackend.ErrorKind(err) == redisbackend.KindTimeout:
			own++
		default:
			t.Errorf("Hit on a stalled Redis: %v, want a timeout or ErrAbandoned", err)
		}
	}
	if abandoned != 1 || own != 1 {
		t.Errorf("%d abandoned and %d Redis timeouts, want 1 and 1: the call in flight is Redis' failure, the queued caller's giving up is not", abandoned, own)
	}
}

// sentHook signals ch, without blocking, when a script call reaches the
// client.
type sentHook struct{ ch chan struct{} }

func (*sentHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *sentHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if cmd.Name() == "evalsha" {
			select {
			case h.ch <- struct{}{}:
			default:
			}
		}
		return next(ctx, cmd)
	}
}

func (*sentHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

func TestKilled(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	// The fixture's generous Timeout: a refused connection must fail as one,
	// which a short Timeout on a busy machine could turn into a timeout.
	f := singleEnv(s).fixture(t, redisbackend.Options{})
	k := f.key(0)
	f.hit(bucket.Hit{Key: k, Limit: slow, Cost: 1})
	s.Kill()
	states := make([]bucket.State, 1)
	_, err := f.l.Hit(context.Background(), []bucket.Hit{{Key: k, Limit: slow, Cost: 1}}, states)
	if kind := redisbackend.ErrorKind(err); kind != redisbackend.KindConnection || !errors.Is(err, redisbackend.ErrConnection) {
		t.Errorf("Hit on a killed Redis: %v (kind %q), want kind connection", err, kind)
	}
	s.Restart()
	deadline := time.Now().Add(5 * time.Second)
	for {
		d, err := f.l.Hit(context.Background(), []bucket.Hit{{Key: k, Limit: slow, Cost: 1}}, states)
		ok := d.Allowed
		if err == nil {
			if !ok || states[0].Remaining != 4 {
				t.Errorf("after a restart (data lost): %v %+v, want allowed with 4 left", ok, states[0])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Hit after Restart still fails after 5s: %v", err)
		}
		time.Sleep(time.Millisecond) // poll interval, bounded by the deadline
	}
}

func TestStatesTooShort(t *testing.T) {
	t.Parallel()
	l := redisbackend.New(redisbackend.Options{})
	_, err := l.Hit(context.Background(), []bucket.Hit{{}, {}}, make([]bucket.State, 1))
	if err == nil {
		t.Errorf("Hit with 2 hits and 1 state: no error, want one")
	}
}

func testManyHits(t *testing.T, e env) {
	f := e.fixture(t, redisbackend.Options{})
	hits := make([]bucket.Hit, 70)
	for i := range hits {
		hits[i] = bucket.Hit{Key: f.key(i), Limit: hourly, Cost: 1}
	}
	if ok, st := f.hit(hits...); !ok {
		t.Fatalf("70 fresh buckets: refused %+v", st)
	}
	hits[66].Limit.Requests = 0 // beyond the first 64: the mask's overflow
	ok, st := f.hit(hits...)
	if ok || st[66].Allowed || !st[0].Allowed || !st[69].Allowed {
		t.Fatalf("70 buckets, one with Requests 0: %v, states 0, 66, 69: %+v %+v %+v; want refused by 66 only",
			ok, st[0], st[66], st[69])
	}
	for _, i := range []int{0, 65, 69} {
		if got := f.remaining(f.key(i), hourly); got != 4 {
			t.Errorf("bucket %d after the refusal: %d tokens, want 4", i, got)
		}
	}
}

// waitHitOK polls a check-only Hit on key until Redis answers again, for at
// most 5 s.
func waitHitOK(t *testing.T, l *redisbackend.Limiter, key bucket.Key, limit bucket.Limit) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		states := make([]bucket.State, 1)
		_, err := l.Hit(context.Background(), []bucket.Hit{{Key: key, Limit: limit, Cost: 0}}, states)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("Hit after Resume still fails after 5s: %v", err)
		}
		time.Sleep(time.Millisecond) // poll interval, bounded by the deadline
	}
}
