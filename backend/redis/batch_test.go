package redis_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/internal/redistest"
)

// day is a limit that refills one token a day: nothing refills during a
// test, so the tokens taken are exactly the burst.
func day(burst uint64) bucket.Limit {
	return bucket.Limit{Requests: 1, Period: 24 * time.Hour, Burst: burst}
}

// hammer runs callers goroutines, released together, each making each
// decisions of hits, and returns how many were allowed. Errors fail the test.
func hammer(t *testing.T, l *redisbackend.Limiter, callers, each int, hits ...bucket.Hit) int64 {
	t.Helper()
	var allowed atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range callers {
		wg.Go(func() {
			<-start
			states := make([]bucket.State, len(hits))
			for range each {
				d, err := l.Hit(context.Background(), hits, states)
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
	close(start)
	wg.Wait()
	return allowed.Load()
}

// latency is a go-redis hook that delays every script call (alone or in a
// pipeline) by d, as a network between sluice and Redis would. On loopback,
// in a test binary slowed by -race on a busy machine, preparing a call can
// take longer than its round trip: callers then rarely find a call in
// flight, and each is rightly sent alone. The delay makes them overlap as
// they do in production.
type latency time.Duration

func (latency) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (d latency) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if cmd.Name() == "evalsha" {
			time.Sleep(time.Duration(d)) // the simulated network, not a wait for a condition
		}
		return next(ctx, cmd)
	}
}

func (d latency) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		time.Sleep(time.Duration(d)) // the simulated network, not a wait for a condition
		return next(ctx, cmds)
	}
}

// testBatching: 64 concurrent callers share script calls, and a shared
// bucket still gives exactly its burst.
func testBatching(t *testing.T, e env) {
	f := e.fixture(t, redisbackend.Options{})
	f.client.AddHook(latency(2 * time.Millisecond))
	const callers, each, burst = 64, 20, 500
	k := f.key(0)
	before := f.calls.Load()
	got := hammer(t, f.l, callers, each, bucket.Hit{Key: k, Limit: day(burst), Cost: 1})
	calls := f.calls.Load() - before
	t.Logf("%d decisions from %d callers: %d script calls", callers*each, callers, calls)
	if got != burst {
		t.Errorf("%d decisions on a bucket of %d: %d allowed, want %d", callers*each, burst, got, burst)
	}
	if calls >= callers*each/2 {
		t.Errorf("%d decisions from %d callers: %d script calls, want fewer than %d (batched)",
			callers*each, callers, calls, callers*each/2)
	}
	if left := f.remaining(k, day(burst)); left != 0 {
		t.Errorf("bucket after the run: %d tokens, want 0", left)
	}
}

// testBatchingAllOrNothing: decisions sharing a script call stay
// all-or-nothing each. Every decision takes from a scarce and a plentiful
// bucket; exactly the scarce burst is allowed, and the plentiful bucket
// loses exactly as many tokens (refused decisions took nothing, or were
// refunded in a cluster, where the buckets' slots differ).
func testBatchingAllOrNothing(t *testing.T, e env) {
	f := e.fixture(t, redisbackend.Options{})
	f.client.AddHook(latency(time.Millisecond)) // more decisions per call
	const callers, each = 64, 10
	scarce, plenty := f.key(0), f.key(1)
	got := hammer(t, f.l, callers, each,
		bucket.Hit{Key: plenty, Limit: day(1000), Cost: 1},
		bucket.Hit{Key: scarce, Limit: day(100), Cost: 1},
	)
	if got != 100 {
		t.Errorf("%d decisions on buckets of 1000 and 100: %d allowed, want 100", callers*each, got)
	}
	if left := f.remaining(plenty, day(1000)); left != 900 {
		t.Errorf("plentiful bucket: %d tokens, want 900 (one per allowed decision)", left)
	}
	if left := f.remaining(scarce, day(100)); left != 0 {
		t.Errorf("scarce bucket: %d tokens, want 0", left)
	}
}

// callerKey marks a caller's context, to find it in the hook that sees the
// script call.
type callerKey struct{}

// callerHook records the callerKey value of the contexts of script calls.
type callerHook struct {
	mu   sync.Mutex
	seen []any
}

func (*callerHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *callerHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if cmd.Name() == "evalsha" {
			h.mu.Lock()
			h.seen = append(h.seen, ctx.Value(callerKey{}))
			h.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func (*callerHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// testLoneRequest: a request finding Redis idle is not held back to wait for
// company: it is sent at once, alone, from the caller's own goroutine, as the
// caller's context in the script call shows.
func testLoneRequest(t *testing.T, e env) {
	f := e.fixture(t, redisbackend.Options{})
	h := &callerHook{}
	f.client.AddHook(h)
	for i := range 3 {
		ctx := context.WithValue(context.Background(), callerKey{}, i)
		states := make([]bucket.State, 1)
		if _, err := f.l.Hit(ctx, []bucket.Hit{{Key: f.key(0), Limit: slow, Cost: 1}}, states); err != nil {
			t.Fatalf("Hit %d: %v", i, err)
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.seen) != 3 || h.seen[0] != 0 || h.seen[1] != 1 || h.seen[2] != 2 {
		t.Errorf("script calls of 3 lone hits carried callers %v, want [0 1 2]: one call each, made by its caller", h.seen)
	}
}

// TestStallConcurrent: on a stalled Redis, every one of 64 concurrent
// callers, in flight or queued, gets a timeout within the Timeout (plus
// scheduling slack), and the Limiter recovers when Redis does.
func TestStallConcurrent(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	const timeout = 50 * time.Millisecond
	f := singleEnv(s).fixture(t, redisbackend.Options{Timeout: timeout})
	k := f.key(0)
	f.warm(k, slow)
	s.Stall()
	defer s.Resume()
	stalledFrom := f.calls.Load()
	// The callers start together (a busy machine would otherwise spread
	// their starts over several Timeouts, each its own call), and are held
	// to a baseline measured with them: a timer of the Timeout's length.
	release := make(chan struct{})
	baseline := make(chan time.Duration, 1)
	go func() {
		<-release
		start := time.Now()
		<-time.After(timeout)
		baseline <- time.Since(start)
	}()
	tooks := make([]time.Duration, 64)
	var wg sync.WaitGroup
	for i := range tooks {
		wg.Go(func() {
			<-release
			start := time.Now()
			states := make([]bucket.State, 1)
			_, err := f.l.Hit(context.Background(), []bucket.Hit{{Key: k, Limit: slow, Cost: 1}}, states)
			took := time.Since(start)
			if kind := redisbackend.ErrorKind(err); kind != redisbackend.KindTimeout || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Hit on a stalled Redis: %v (kind %q), want kind timeout", err, kind)
			}
			if took < timeout {
				t.Errorf("Hit on a stalled Redis gave up after %v, before its %v timeout", took, timeout)
			}
			tooks[i] = took
		})
	}
	close(release)
	wg.Wait()
	base := <-baseline
	for _, took := range tooks {
		if took > base+250*time.Millisecond {
			t.Errorf("Hit on a stalled Redis took %v, want ≈ the %v timeout (a %v timer started with it fired after %v)",
				took, timeout, timeout, base)
		}
	}
	calls := f.calls.Load() - stalledFrom
	t.Logf("64 callers on a stalled Redis: %d script calls", calls)
	s.Resume()
	waitHitOK(t, f.l, k, slow)
	// Queued callers share the few calls in flight; those who gave up are
	// not sent at all: the stall cost a handful of script calls, not 64.
	if calls >= 16 {
		t.Errorf("64 callers on a stalled Redis made %d script calls, want a handful", calls)
	}
}

// TestClose: Hit fails after Close, with a connection error (the caller
// falls back); Close is idempotent.
func TestClose(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	f := singleEnv(s).fixture(t, redisbackend.Options{})
	f.hit(bucket.Hit{Key: f.key(0), Limit: slow, Cost: 1})
	f.l.Close()
	f.l.Close()
	states := make([]bucket.State, 1)
	_, err := f.l.Hit(context.Background(), []bucket.Hit{{Key: f.key(0), Limit: slow, Cost: 1}}, states)
	if kind := redisbackend.ErrorKind(err); kind != redisbackend.KindConnection {
		t.Errorf("Hit after Close: %v (kind %q), want kind connection", err, kind)
	}
}
