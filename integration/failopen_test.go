//go:build integration

package integration

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-rls/sluice/internal/redistest"
)

// redisErrorKinds are the kind label values of ratelimit_redis_errors_total.
var redisErrorKinds = []string{"timeout", "connection", "script", "oom", "noperm", "other"}

// redisErrors sums ratelimit_redis_errors_total over its kinds.
func redisErrors(t *testing.T, p *rlsProcess) float64 {
	t.Helper()
	sum := 0.0
	for _, k := range redisErrorKinds {
		v, _ := scrapeMetric(t, p, fmt.Sprintf("ratelimit_redis_errors_total{kind=%q}", k))
		sum += v
	}
	return sum
}

// TestShortCallerDeadlinesKeepNodeOnRedis floods a node on a healthy Redis
// with calls whose gRPC deadline is 1ms, most of which expire before their
// answer: the callers' deadlines are not Redis failing, so the node stays on
// Redis, with no transition and no Redis error counted.
func TestShortCallerDeadlinesKeepNodeOnRedis(t *testing.T) {
	s := redistest.Start(t)
	// A generous Redis deadline: only the callers' deadlines could expire.
	p := startFaultRLS(t, "redis://"+s.Addr()+"/0", "--redis-timeout", "1s")
	probe := &layerProbe{p: p}
	settle(t, p, probe)
	fallbacks, errs := metricValue(t, p, toFallbackSeries), redisErrors(t, p)

	const (
		workers  = 8
		deadline = time.Millisecond
		flood    = 2 * time.Second
	)
	var answered, expired, calls atomic.Int64
	var otherErr sync.Once
	end := time.Now().Add(flood)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := 0; time.Now().Before(end); i++ {
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				_, err := p.Client.ShouldRateLimit(ctx, request("fault", fmt.Sprintf("client=flood-%d-%d", w, i%16)))
				cancel()
				calls.Add(1)
				switch {
				case err == nil:
					answered.Add(1)
				case status.Code(err) == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded):
					expired.Add(1)
				default:
					otherErr.Do(func() { t.Errorf("a 1ms call failed otherwise than by its deadline: %v", err) })
				}
			}
		})
	}
	wg.Wait()
	t.Logf("%d calls with a %v deadline in %v: %d answered, %d expired", calls.Load(), deadline, flood, answered.Load(), expired.Load())
	if expired.Load() == 0 {
		t.Fatalf("no call expired: the flood exercised nothing (machine too fast for a %v deadline)", deadline)
	}
	if got := metricValue(t, p, toFallbackSeries) - fallbacks; got != 0 {
		t.Errorf("%v transitions to fallback during the flood, want 0: a caller's deadline is not a Redis failure", got)
	}
	if got := redisErrors(t, p) - errs; got != 0 {
		t.Errorf("%v Redis errors counted during the flood, want 0", got)
	}
	if !metricIs(t, p, "ratelimit_fallback_active", 0) {
		t.Errorf("ratelimit_fallback_active is not 0 after the flood")
	}
	if l := probe.layer(t); l != "global" {
		t.Errorf("after the flood a refusal came from layer %q, want global", l)
	}
}
