package service_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rls/sluice/backend/memory"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/fallback"
	"github.com/sluice-rls/sluice/service"
)

// flakyLimiter plays Redis: it delegates to memory buckets until told to
// fail, and counts calls.
type flakyLimiter struct {
	inner bucket.Limiter
	fail  atomic.Bool
	slow  atomic.Bool // time out, as backend/redis past --redis-timeout
	calls atomic.Int64
}

var errDown = errors.New("redis down")

// errGaveUp marks the errors of callers that gave up, as
// backend/redis.ErrAbandoned does.
var errGaveUp = errors.New("caller gave up")

func (f *flakyLimiter) Hit(ctx context.Context, hits []bucket.Hit, states []bucket.State) (bucket.Decision, error) {
	f.calls.Add(1)
	if f.fail.Load() {
		return bucket.Decision{}, errDown // Redis' own failure, whatever ctx does
	}
	if f.slow.Load() {
		return bucket.Decision{}, fmt.Errorf("redis: %w", context.DeadlineExceeded)
	}
	// As backend/redis: a caller that gave up gets its context's error.
	if err := ctx.Err(); err != nil {
		return bucket.Decision{}, fmt.Errorf("redis: %w: %w", errGaveUp, err)
	}
	return f.inner.Hit(ctx, hits, states)
}

// Shared reports true, as Redis.
func (f *flakyLimiter) Shared() bool { return true }

type fallbackHarness struct {
	*harness
	primary *flakyLimiter
	sw      *fallback.Limiter
	probeOK atomic.Bool
	probes  atomic.Int64
	// recovered receives when a probe found Redis answering.
	recovered chan struct{}
}

func newFallbackHarness(t *testing.T, mode fallback.Mode, nodes int, opts ...func(*fallback.Options)) *fallbackHarness {
	t.Helper()
	fh := &fallbackHarness{recovered: make(chan struct{}, 1)}
	reg := prometheus.NewRegistry()
	clock := clockwork.NewFakeClockAt(harnessStart)
	fh.harness = newHarnessOn(t, clock, `
domain: edge
descriptors:
  - key: user_id
    rate_limit: {unit: second, requests_per_unit: 8, burst: 8}
  - key: ip
    rate_limit:
      local: {unit: second, requests_per_unit: 3}
`, func(o *service.Options) {
		o.Metrics = service.NewMetrics(reg)
		fh.primary = &flakyLimiter{inner: memory.New(memory.Options{Clock: clock})}
		fo := fallback.Options{
			Primary: fh.primary,
			Share:   memory.New(memory.Options{Clock: clock}),
			Probe: func(context.Context) error {
				fh.probes.Add(1)
				if fh.probeOK.Load() {
					fh.recovered <- struct{}{}
					return nil
				}
				return errDown
			},
			Nodes:     func() int { return nodes },
			Mode:      mode,
			Metrics:   fallback.NewMetrics(reg, []string{"other"}),
			Abandoned: func(err error) bool { return errors.Is(err, errGaveUp) },
			Clock:     clock, // the probe's backoff runs on the harness' clock
		}
		for _, f := range opts {
			f(&fo)
		}
		fh.sw = fallback.New(fo)
		o.Global = fh.sw
		o.Local = fh.sw.GuardLocal(o.Local)
	})
	fh.harness.reg = reg
	t.Cleanup(fh.sw.Close)
	return fh
}

func TestFallbackSharesGlobalLimit(t *testing.T) {
	fh := newFallbackHarness(t, fallback.Share, 4)
	req := request("edge", desc("user_id=u"))
	// Another user: what a node admits through Redis is charged to its
	// share too (fallback.Limiter tracks it), and u's share starts full.
	if got := fh.admitted(t, 2, request("edge", desc("user_id=healthy"))); got != 2 {
		t.Fatalf("healthy: admitted %d of 2", got)
	}
	fh.primary.fail.Store(true)
	calls := fh.primary.calls.Load()
	// This node's share of burst 8 among 4 nodes is 2 tokens.
	if got := fh.admitted(t, 10, req); got != 2 {
		t.Errorf("in fallback admitted %d of 10, want 2 (burst 8 / 4 nodes)", got)
	}
	if got := fh.primary.calls.Load() - calls; got != 1 {
		t.Errorf("Redis was called %d times during the outage, want 1 (the call that failed)", got)
	}
	resp := fh.call(t, req)
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || headerValue(resp, "x-ratelimit-layer") != "fallback" {
		t.Errorf("refusal in fallback: %v, layer %q", resp.GetOverallCode(), headerValue(resp, "x-ratelimit-layer"))
	}
	// The fallback refills at rate/N: 8/s / 4 = one token per 500ms.
	fh.clock.Advance(500 * time.Millisecond)
	if got := fh.admitted(t, 3, req); got != 1 {
		t.Errorf("after 500ms in fallback admitted %d, want 1", got)
	}
	if !fh.sw.Active() || metricValue(t, fh.harness, "ratelimit_fallback_active", nil) != 1 {
		t.Errorf("fallback not visible: InFallback %v", fh.sw.Active())
	}

	fh.primary.fail.Store(false)
	fh.recover(t)
	calls = fh.primary.calls.Load()
	fh.call(t, req)
	if fh.primary.calls.Load() == calls {
		t.Errorf("back on Redis, but the request did not reach it")
	}
	if got := metricValue(t, fh.harness, "ratelimit_fallback_transitions_total", map[string]string{"to": "redis"}); got != 1 {
		t.Errorf("transitions to redis = %v, want 1", got)
	}
}

func TestFallbackModes(t *testing.T) {
	tests := []struct {
		mode     fallback.Mode
		admitted int // of 10 user_id requests during the outage
	}{
		{fallback.Local, 10},
		{fallback.Allow, 10},
		{fallback.Deny, 0},
	}
	for _, tt := range tests {
		t.Run(tt.mode.String(), func(t *testing.T) {
			fh := newFallbackHarness(t, tt.mode, 1)
			fh.primary.fail.Store(true)
			if got := fh.admitted(t, 10, request("edge", desc("user_id=u"))); got != tt.admitted {
				t.Errorf("admitted %d of 10, want %d", got, tt.admitted)
			}
			// The local layer: enforced by local and deny, not by allow.
			wantLocal := 3
			if tt.mode == fallback.Allow {
				wantLocal = 10
			}
			if got := fh.admitted(t, 10, request("edge", desc("ip=1"))); got != wantLocal {
				t.Errorf("local-only rule admitted %d of 10, want %d", got, wantLocal)
			}
		})
	}
}

func TestFallbackConcurrentFailuresSwitchOnce(t *testing.T) {
	fh := newFallbackHarness(t, fallback.Share, 1)
	fh.primary.fail.Store(true)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				if _, err := fh.srv.ShouldRateLimit(context.Background(), request("edge", desc("user_id=x"))); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if got := metricValue(t, fh.harness, "ratelimit_fallback_transitions_total", map[string]string{"to": "fallback"}); got != 1 {
		t.Errorf("transitions to fallback = %v, want 1", got)
	}
}

// TestFallbackIgnoresCallersDeadline: calls whose caller's deadline has
// passed, or which the caller cancelled, fail for that caller alone; the
// node stays on Redis and counts no Redis error. A failure of Redis' own
// (its deadline, with the caller still waiting) still switches it.
func TestFallbackIgnoresCallersDeadline(t *testing.T) {
	fh := newFallbackHarness(t, fallback.Share, 1)
	req := request("edge", desc("user_id=u"))
	expired, cancel := context.WithDeadline(context.Background(), time.Unix(1, 0))
	defer cancel()
	cancelled, cancel2 := context.WithCancel(context.Background())
	cancel2()
	for i := range 100 {
		ctx := expired
		if i%2 == 1 {
			ctx = cancelled
		}
		if _, err := fh.srv.ShouldRateLimit(ctx, req); err != nil {
			t.Fatalf("ShouldRateLimit with the caller gone: %v", err)
		}
	}
	if fh.sw.Active() {
		t.Fatalf("in fallback after callers whose deadline passed or who cancelled: Redis was not to blame")
	}
	if got := metricValue(t, fh.harness, "ratelimit_fallback_transitions_total", map[string]string{"to": "fallback"}); got != 0 {
		t.Errorf("transitions to fallback = %v, want 0", got)
	}
	if got := metricValue(t, fh.harness, "ratelimit_redis_errors_total", map[string]string{"kind": "other"}); got != 0 {
		t.Errorf("ratelimit_redis_errors_total = %v, want 0: the callers gave up, Redis did not fail", got)
	}
	if got := metricValue(t, fh.harness, "ratelimit_global_errors_total", nil); got != 0 {
		t.Errorf("ratelimit_global_errors_total = %v, want 0: the callers gave up, the global layer did not fail", got)
	}
	if got := fh.primary.calls.Load(); got != 100 {
		t.Errorf("Redis was called %d times, want 100: the node must stay on it", got)
	}

	// Redis failing on its own while its caller has given up: a failure
	// (Redis stalls and every caller's deadline is shorter than its own).
	fh.primary.fail.Store(true)
	if _, err := fh.srv.ShouldRateLimit(expired, req); err != nil {
		t.Fatal(err)
	}
	if !fh.sw.Active() {
		t.Errorf("not in fallback after Redis itself failed, its caller gone")
	}
}

// recover lets the probe find Redis answering: it waits for the probe to
// wait on the clock, moves the clock past the longest backoff, and returns
// once the probe has switched the node back.
func (fh *fallbackHarness) recover(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fh.probeOK.Store(true)
	if err := fh.clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatalf("the probe never waited: %v", err)
	}
	fh.clock.Advance(time.Second)
	select {
	case <-fh.recovered:
	case <-ctx.Done():
		t.Fatal("the probe did not run after its backoff")
	}
	fh.sw.Close() // waits for the probe to finish switching back
}

func TestFallbackOneSlowCallIsNoStall(t *testing.T) {
	var fh *fallbackHarness
	fh = newFallbackHarness(t, fallback.Share, 1, func(o *fallback.Options) {
		o.StallAfter = 30 * time.Millisecond
	})
	req := request("edge", desc("user_id=u"))
	fh.call(t, req) // a success
	fh.primary.slow.Store(true)
	fh.clock.Advance(10 * time.Millisecond)
	if got := fh.call(t, req).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("timed-out call answered %v, want OK from the fallback", got)
	}
	if fh.sw.Active() {
		t.Fatal("one timeout 10ms after a success switched the node (StallAfter 30ms)")
	}
	fh.primary.slow.Store(false)
	calls := fh.primary.calls.Load()
	fh.call(t, req)
	if fh.primary.calls.Load() == calls {
		t.Fatal("the next request did not reach Redis")
	}

	// A stall: timeouts and no success for StallAfter.
	fh.primary.slow.Store(true)
	fh.clock.Advance(20 * time.Millisecond)
	fh.call(t, req)
	if fh.sw.Active() {
		t.Fatal("switched 20ms after the last success (StallAfter 30ms)")
	}
	fh.clock.Advance(15 * time.Millisecond)
	fh.call(t, req)
	if !fh.sw.Active() {
		t.Fatal("still on Redis after 35ms of timeouts without a success")
	}
	if got := metricValue(t, fh.harness, "ratelimit_redis_errors_total", map[string]string{"kind": "other"}); got != 3 {
		t.Errorf("Redis errors counted %v, want 3 (each timeout)", got)
	}

	// Any other error switches at once.
	fh2 := newFallbackHarness(t, fallback.Share, 1, func(o *fallback.Options) { o.StallAfter = time.Hour })
	fh2.call(t, req)
	fh2.primary.fail.Store(true)
	fh2.call(t, req)
	if !fh2.sw.Active() {
		t.Error("a connection error did not switch at once")
	}
}

func TestFallbackTimeoutsAmidSuccessesSwitch(t *testing.T) {
	// A dead Redis Cluster master while the others answer: its buckets'
	// calls time out every time, the rest succeed in between.
	var fh *fallbackHarness
	fh = newFallbackHarness(t, fallback.Share, 1, func(o *fallback.Options) {
		o.StallAfter = 30 * time.Millisecond
	})
	req := request("edge", desc("user_id=u"))
	fh.call(t, req) // Redis answered once
	for step := range 4 {
		fh.primary.slow.Store(true)
		fh.call(t, req)
		if step < 3 && fh.sw.Active() {
			t.Fatalf("switched after timeouts for %v (StallAfter 30ms)", time.Duration(step)*10*time.Millisecond)
		}
		fh.primary.slow.Store(false)
		if step < 3 {
			fh.call(t, req) // a success between the timeouts
		}
		fh.clock.Advance(10 * time.Millisecond)
	}
	if !fh.sw.Active() {
		t.Fatal("still on Redis after timeouts kept coming for 30ms")
	}
}
