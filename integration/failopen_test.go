//go:build integration

package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"
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
	t.Parallel()
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

// documentedACL returns the least-privilege ACL SETUSER line of
// docs/redis.md, split into arguments, so that the test checks the
// documented line itself.
func documentedACL(t *testing.T) []any {
	t.Helper()
	doc, err := os.ReadFile("../docs/redis.md")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(doc), "\n") {
		if strings.HasPrefix(line, "ACL SETUSER sluice ") {
			var args []any
			for _, f := range strings.Fields(line) {
				args = append(args, f)
			}
			return args
		}
	}
	t.Fatal("docs/redis.md has no line starting with `ACL SETUSER sluice`")
	return nil
}

// startACLRedis starts a redis-server with docs/redis.md's sluice user and
// returns it with an admin client (the default user).
func startACLRedis(t *testing.T) (*redistest.Server, *goredis.Client) {
	t.Helper()
	s := redistest.Start(t)
	admin := s.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := admin.Do(ctx, documentedACL(t)...).Err(); err != nil {
		t.Fatalf("the ACL of docs/redis.md: %v", err)
	}
	return s, admin
}

// TestDocumentedACL runs a node as docs/redis.md's least-privilege user:
// decisions, the node registry and the graceful leave work; a 1.5s CLIENT
// PAUSE under load (longer than the stall probe's 1s: a shorter pause is
// one slow moment and switches nothing) sends the node to fallback, and it
// comes back when the
// pause ends (before the probe ran the script itself, it needed SCRIPT
// LOAD, which the documented user lacks: the node stayed in fallback).
func TestDocumentedACL(t *testing.T) {
	t.Parallel()
	s, admin := startACLRedis(t)
	p := startFaultRLS(t, "redis://sluice:s3cret@"+s.Addr()+"/0")
	probe := &layerProbe{p: p}
	settle(t, p, probe)
	pollFor(t, 5*time.Second, "ratelimit_live_nodes 1 (heartbeats as the ACL user)", func() bool {
		return metricIs(t, p, "ratelimit_live_nodes", 1)
	})
	fallbacks := metricValue(t, p, toFallbackSeries)

	load := loadOneKey(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	paused := time.Now()
	if err := admin.Do(ctx, "CLIENT", "PAUSE", "1500").Err(); err != nil {
		t.Fatalf("CLIENT PAUSE 1500: %v", err)
	}
	pollFor(t, 5*time.Second, "a transition to fallback during the pause", func() bool {
		return metricValue(t, p, toFallbackSeries) > fallbacks
	})
	waitGlobal(t, p, probe)
	back := time.Since(paused)
	as, _ := finishLoad(t, p, load)
	t.Logf("CLIENT PAUSE 1500: back on the global layer %v after the pause began; %d answers, transitions to fallback %v",
		back.Round(time.Millisecond), len(as), metricValue(t, p, toFallbackSeries)-fallbacks)
	if back > 5*time.Second {
		t.Errorf("back on the global layer %v after the pause began, want within 5s", back)
	}

	// The graceful leave: SIGTERM removes this node from the registry.
	if n := admin.ZCard(ctx, "sluice:{nodes}").Val(); n != 1 {
		t.Errorf("sluice:{nodes} has %d members while the node runs, want 1", n)
	}
	p.Signal(t, syscall.SIGTERM)
	if err := p.Wait(t, 30*time.Second); err != nil {
		t.Errorf("rls exit after SIGTERM: %v", err)
	}
	if n := admin.ZCard(ctx, "sluice:{nodes}").Val(); n != 0 {
		t.Errorf("sluice:{nodes} has %d members after SIGTERM, want 0: the leave failed", n)
	}
}

// TestScriptRefusedStaysInFallback: a Redis that answers PING but refuses
// the script (out of memory with noeviction; an ACL without EVALSHA) keeps
// the node in fallback, with one transition and no flapping, the errors
// counted under the kind Redis gives; once Redis accepts the script again
// the node goes back.
func TestScriptRefusedStaysInFallback(t *testing.T) {
	t.Parallel()
	s, admin := startACLRedis(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// SCRIPT LOAD too: a probe that only loads the script (as before the
	// probe ran it) passes on such a Redis, and the node went back and forth.
	if err := admin.Do(ctx, "ACL", "SETUSER", "sluice", "+script|load").Err(); err != nil {
		t.Fatal(err)
	}
	p := startFaultRLS(t, "redis://sluice:s3cret@"+s.Addr()+"/0")
	probe := &layerProbe{p: p}
	for _, tt := range []struct {
		kind         string
		break_, mend []any
	}{
		{"oom", []any{"CONFIG", "SET", "maxmemory", "1"}, []any{"CONFIG", "SET", "maxmemory", "0"}},
		{"noperm", []any{"ACL", "SETUSER", "sluice", "-evalsha", "-eval"}, []any{"ACL", "SETUSER", "sluice", "+evalsha", "+eval"}},
	} {
		settle(t, p, probe)
		fallbacks, backs := metricValue(t, p, toFallbackSeries), metricValue(t, p, toRedisSeries)
		kindSeries := fmt.Sprintf("ratelimit_redis_errors_total{kind=%q}", tt.kind)
		kinds, scripts := metricValue(t, p, kindSeries), metricValue(t, p, `ratelimit_redis_errors_total{kind="script"}`)
		if err := admin.Do(ctx, tt.break_...).Err(); err != nil {
			t.Fatalf("%v: %v", tt.break_, err)
		}
		load := loadOneKey(t, p)
		pollFor(t, 5*time.Second, tt.kind+": ratelimit_fallback_active 1", func() bool {
			return metricIs(t, p, "ratelimit_fallback_active", 1)
		})
		hold(3 * time.Second) // probes at 50ms, 100ms, ... 1s: several would have passed
		as := load.stop()
		flaps := metricValue(t, p, toFallbackSeries) - fallbacks
		t.Logf("%s: %d answers in about 3s; transitions to fallback %v, to redis %v; %s +%v",
			tt.kind, len(as), flaps, metricValue(t, p, toRedisSeries)-backs, kindSeries, metricValue(t, p, kindSeries)-kinds)
		if flaps != 1 || metricValue(t, p, toRedisSeries) != backs {
			t.Errorf("%s: %v transitions to fallback and %v back to redis while Redis refused the script, want 1 and 0",
				tt.kind, flaps, metricValue(t, p, toRedisSeries)-backs)
		}
		if metricValue(t, p, kindSeries) <= kinds {
			t.Errorf("%s: %s did not rise", tt.kind, kindSeries)
		}
		if v := metricValue(t, p, `ratelimit_redis_errors_total{kind="script"}`); v != scripts {
			t.Errorf("%s: kind=\"script\" rose by %v, want the errors under %q", tt.kind, v-scripts, tt.kind)
		}
		if st := summarize(as); st.errors > 0 {
			t.Errorf("%s: %d gRPC errors, want 0; first: %v", tt.kind, st.errors, st.firstErr)
		}
		if err := admin.Do(ctx, tt.mend...).Err(); err != nil {
			t.Fatalf("%v: %v", tt.mend, err)
		}
		back := waitGlobal(t, p, probe)
		t.Logf("%s mended: back on the global layer after %v", tt.kind, back.Round(time.Millisecond))
	}
}

// TestNeverReachedRedisUsesInitialNodes starts a node while Redis is down:
// it has never read the node registry, so it must not assume it is alone
// (N = 1, admitting the whole global limit): N is the default 10, shown as
// ratelimit_fallback_nodes{source="default"}. Once Redis answers, N comes
// from the registry.
func TestNeverReachedRedisUsesInitialNodes(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	s.Kill()
	p := startFaultRLS(t, "redis://"+s.Addr()+"/0")
	if v, ok := scrapeMetric(t, p, `ratelimit_fallback_nodes{source="default"}`); v != 10 {
		t.Errorf(`ratelimit_fallback_nodes{source="default"} %v (present: %v), want 10 before the node reached Redis`, v, ok)
	}
	if v := metricValue(t, p, "ratelimit_live_nodes"); v != 10 {
		t.Errorf("ratelimit_live_nodes %v, want 10 (the N in use)", v)
	}
	// slow: 5 a minute, burst 5. At N = 10 this node's share is a burst of
	// 1 (at least one token) refilled every 2 minutes.
	admitted := 0
	for range 5 {
		if ask(t, p, "fault", "slow=unseen").GetOverallCode() == rlsv3.RateLimitResponse_OK {
			admitted++
		}
	}
	if !metricIs(t, p, "ratelimit_fallback_active", 1) {
		t.Fatalf("ratelimit_fallback_active is not 1 with Redis down")
	}
	if admitted != 1 {
		t.Errorf("admitted %d of 5 on a burst-5 rule in fallback before reaching Redis, want 1 (burst/10, at least 1); 5 means N = 1", admitted)
	}

	s.Restart()
	waitGlobal(t, p, &layerProbe{p: p})
	pollFor(t, 5*time.Second, `ratelimit_fallback_nodes{source="registry"} 1`, func() bool {
		return metricIs(t, p, `ratelimit_fallback_nodes{source="registry"}`, 1)
	})
	if v := metricValue(t, p, `ratelimit_fallback_nodes{source="default"}`); v != 0 {
		t.Errorf(`ratelimit_fallback_nodes{source="default"} %v once the registry was read, want 0`, v)
	}
}

// TestStallWithShortCallerDeadlinesFallsBack stalls Redis (SIGSTOP) while
// every caller's deadline (5ms) is shorter than --redis-timeout (50ms), as
// with an Envoy timeout below it: the callers give up first, but the calls
// in flight time out on Redis' own deadline, which is Redis failing, so the
// node still goes to fallback, and back once Redis resumes.
func TestStallWithShortCallerDeadlinesFallsBack(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	p := startFaultRLS(t, "redis://"+s.Addr()+"/0", "--redis-timeout", "50ms")
	probe := &layerProbe{p: p}
	settle(t, p, probe)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
				_, _ = p.Client.ShouldRateLimit(ctx, request("fault", fmt.Sprintf("client=short-%d-%d", w, i%16)))
				cancel()
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	s.Stall()
	stalled := time.Now()
	toFallback := pollFor(t, 5*time.Second, "ratelimit_fallback_active 1 with Redis stalled and every caller gone first", func() bool {
		return metricIs(t, p, "ratelimit_fallback_active", 1)
	})
	if v := metricValue(t, p, `ratelimit_redis_errors_total{kind="timeout"}`); v < 1 {
		t.Errorf(`ratelimit_redis_errors_total{kind="timeout"} %v, want ≥ 1: Redis' own deadline passed`, v)
	}
	s.Resume()
	back := waitGlobal(t, p, probe)
	t.Logf("Redis stalled under 5ms callers: fallback after %v, back on global %v after SIGCONT (stalled %v)",
		toFallback.Round(time.Millisecond), back.Round(time.Millisecond), time.Since(stalled).Round(time.Millisecond))
}
