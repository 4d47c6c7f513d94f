//go:build integration

package integration

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-rls/sluice/internal/redistest"
)

// leaseRules are leased global rules (rate_limit.consistency). Each test
// runs its own Redis and nodes, and keeps its run to 3 s or less (the
// issue asked for 10 s: the bounds are the same, and the suite must stay
// well inside CI's budget).
const leaseRules = `domain: lease
descriptors:
  - key: shared
    rate_limit: {unit: second, requests_per_unit: 200, burst: 200, consistency: leased}
  - key: kill
    rate_limit: {unit: second, requests_per_unit: 60, burst: 600, consistency: leased}
  - key: term
    rate_limit: {unit: minute, requests_per_unit: 10, burst: 100, consistency: leased}
  - key: big
    rate_limit: {unit: second, requests_per_unit: 1000, burst: 1000, consistency: leased}
  - key: tiny
    rate_limit: {unit: minute, requests_per_unit: 5, burst: 5, consistency: leased}
`

// leaseNodes starts a Redis and three rls nodes serving leaseRules with
// extra flags, and waits until each counts three live nodes (the share of
// a lease).
func leaseNodes(t *testing.T, extra ...string) (*redistest.Server, []*rlsProcess) {
	t.Helper()
	s := redistest.Start(t)
	return s, leaseNodesOn(t, "redis://"+s.Addr()+"/0", leaseRules, extra...)
}

// leaseNodesOn is leaseNodes on the Redis of --redis url, serving rules.
func leaseNodesOn(t *testing.T, url, rules string, extra ...string) []*rlsProcess {
	t.Helper()
	rules = writeFile(t, t.TempDir(), "rules.yaml", rules)
	args := append([]string{"--redis", url, "--config", rules, "--redis-timeout", "200ms"}, extra...)
	nodes := []*rlsProcess{startRLS(t, args...), startRLS(t, args...), startRLS(t, args...)}
	for i, p := range nodes {
		pollFor(t, 10*time.Second, fmt.Sprintf("node %d counting 3 live nodes", i), func() bool {
			v, _ := scrapeMetric(t, p, "ratelimit_live_nodes")
			return v == 3
		})
	}
	return nodes
}

// paced is the outcome of an open-loop load.
type paced struct {
	admitted, refused, errors int
	// first is the load's start, lastSent the last request's send, last
	// its last answer.
	first, lastSent, last time.Time
	latencies             []time.Duration
	firstErr              error
}

// pace sends req to each node at its rate (requests per second) for d, an
// open loop per node (a slow answer delays only that node's next request),
// and adds up the answers.
func pace(t *testing.T, nodes []*rlsProcess, rates []float64, d time.Duration, req *rlsv3.RateLimitRequest) paced {
	t.Helper()
	var mu sync.Mutex
	var out paced
	var wg sync.WaitGroup
	start := time.Now()
	out.first = start
	for i, p := range nodes {
		if rates[i] == 0 {
			continue
		}
		wg.Go(func() {
			every := time.Duration(float64(time.Second) / rates[i])
			for n := 0; ; n++ {
				at := start.Add(time.Duration(n) * every)
				if at.Sub(start) >= d {
					return
				}
				time.Sleep(time.Until(at))
				ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
				t0 := time.Now()
				resp, err := p.Client.ShouldRateLimit(ctx, req)
				t1 := time.Now()
				cancel()
				mu.Lock()
				out.latencies = append(out.latencies, t1.Sub(t0))
				if t0.After(out.lastSent) {
					out.lastSent = t0
				}
				if t1.After(out.last) {
					out.last = t1
				}
				switch {
				case err != nil:
					out.errors++
					if out.firstErr == nil {
						out.firstErr = err
					}
				case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
					out.admitted++
				default:
					out.refused++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

// p99 returns the 99th percentile latency.
func (p paced) p99() time.Duration {
	if len(p.latencies) == 0 {
		return 0
	}
	l := append([]time.Duration(nil), p.latencies...)
	sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
	return l[len(l)*99/100]
}

// checkNeverOver asserts burst + rate × T ≥ admitted ≥ 95% of burst +
// rate × T', T from the load's start to its last answer (every token
// admitted was out of the bucket by then), T' to its last request's send
// (every token in the bucket by then was asked for: a machine slow to
// answer at the end lengthens T, not the demand).
func checkNeverOver(t *testing.T, out paced, burst, rate float64) {
	t.Helper()
	elapsed := out.last.Sub(out.first)
	bound := burst + rate*elapsed.Seconds()
	floor := 0.95 * (burst + rate*out.lastSent.Sub(out.first).Seconds())
	t.Logf("admitted %d, refused %d, errors %d over %v: %.1f%% of burst + rate × T = %.0f (floor %.0f); p99 %v",
		out.admitted, out.refused, out.errors, elapsed.Round(time.Millisecond), 100*float64(out.admitted)/bound, bound, floor, out.p99())
	if out.errors > 0 {
		t.Errorf("%d errors, want 0; first: %v", out.errors, out.firstErr)
	}
	if float64(out.admitted) > bound {
		t.Errorf("admitted %d, over burst + rate × T = %.1f", out.admitted, bound)
	}
	if float64(out.admitted) < floor {
		t.Errorf("admitted %d, under 95%% of burst + rate × T' = %.1f", out.admitted, floor)
	}
}

// TestLeaseNeverOver drives a leased bucket at twice its rate, spread
// evenly over three nodes for 3 s: the fleet admits no more than
// burst + rate × T, and at least 95% of it.
func TestLeaseNeverOver(t *testing.T) {
	_, nodes := leaseNodes(t)
	out := pace(t, nodes, []float64{400.0 / 3, 400.0 / 3, 400.0 / 3}, 3*time.Second, request("lease", "shared=all"))
	checkNeverOver(t, out, 200, 200)
	var fromLease float64
	for _, p := range nodes {
		v, _ := scrapeMetric(t, p, `ratelimit_lease_decisions_total{answer="lease"}`)
		fromLease += v
	}
	t.Logf("decisions answered from a lease: %.0f of %d", fromLease, len(out.latencies))
	if fromLease == 0 {
		t.Error("no decision was answered from a lease")
	}
}

// TestLeaseSkew is TestLeaseNeverOver with 90% of the traffic on one node.
func TestLeaseSkew(t *testing.T) {
	_, nodes := leaseNodes(t)
	out := pace(t, nodes, []float64{360, 20, 20}, 3*time.Second, request("lease", "shared=all"))
	checkNeverOver(t, out, 200, 200)
}

// TestLeaseSIGKILL kills a node holding a lease: the fleet never goes
// over, and its lost tokens are back within one lease period (the bucket
// refills them: a lease is at most what the limit refills in one period).
func TestLeaseSIGKILL(t *testing.T) {
	_, nodes := leaseNodes(t) // --lease-period 1s: a lease of kill is at most 60
	req := request("lease", "kill=k")
	for i := range 2 { // a key's first decision leases nothing; its second does
		if r := nodes[0].Check(t, "lease", "kill=k"); r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request %d: %v", i, r.GetOverallCode())
		}
	}
	if v, _ := scrapeMetric(t, nodes[0], `ratelimit_lease_tokens_total{direction="leased"}`); v != 60 {
		t.Fatalf("node 0 leased %v tokens, want 60", v)
	}
	nodes[0].Signal(t, syscall.SIGKILL)
	_ = nodes[0].Wait(t, 5*time.Second)
	hold(1100 * time.Millisecond) // one lease period, and the refill of the tokens spent
	// Drain from node 1 as fast as it answers: the whole burst is there.
	start := time.Now()
	admitted := 0
	for i := 0; i < 2000; i++ {
		resp, err := nodes[1].Client.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			break
		}
		admitted++
	}
	elapsed := time.Since(start)
	bound := 600 + 60*elapsed.Seconds()
	t.Logf("after the kill and one lease period: %d admitted in %v (burst + rate × T = %.0f)", admitted, elapsed.Round(time.Millisecond), bound)
	if admitted < 600 {
		t.Errorf("admitted %d, want the whole burst of 600: the dead node's lease did not come back", admitted)
	}
	if float64(admitted) > bound {
		t.Errorf("admitted %d, over burst + rate × T = %.0f", admitted, bound)
	}
}

// TestLeaseSIGTERM stops a node holding a lease: it gives the unused
// tokens back before it exits.
func TestLeaseSIGTERM(t *testing.T) {
	// 10 per minute, a 10-minute lease period: a lease is 99 / (2 × 3 nodes).
	_, nodes := leaseNodes(t, "--lease-period", "10m")
	for i := range 2 { // a key's first decision leases nothing; its second does
		if r := nodes[0].Check(t, "lease", "term=t"); r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request %d: %v", i, r.GetOverallCode())
		}
	}
	if v, _ := scrapeMetric(t, nodes[0], `ratelimit_lease_tokens_total{direction="leased"}`); v != 16 {
		t.Fatalf("node 0 leased %v tokens, want 16", v)
	}
	nodes[0].Signal(t, syscall.SIGTERM)
	if err := nodes[0].Wait(t, 10*time.Second); err != nil {
		t.Fatalf("rls exited with %v", err)
	}
	admitted := 0
	for i := 0; i < 200; i++ {
		if nodes[1].Check(t, "lease", "term=t").GetOverallCode() != rlsv3.RateLimitResponse_OK {
			break
		}
		admitted++
	}
	// 98 left after node 0's two requests, plus at most a token or two
	// refilled.
	t.Logf("after SIGTERM: node 1 admitted %d", admitted)
	if admitted < 98 || admitted > 100 {
		t.Errorf("node 1 admitted %d, want 98 (+ refill): node 0's 16 unused tokens were not given back", admitted)
	}
}

// TestLeaseRedisDown stops Redis while a node holds a lease: its tokens
// keep answering, without errors, within Envoy's 20 ms; past them the
// fail-open switch answers, and limiting continues.
func TestLeaseRedisDown(t *testing.T) {
	s, nodes := leaseNodes(t)
	p := nodes[0]
	for i := range 2 { // a key's first decision leases nothing; its second does
		if r := p.Check(t, "lease", "big=b"); r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request %d: %v", i, r.GetOverallCode())
		}
	}
	before, _ := scrapeMetric(t, p, `ratelimit_lease_decisions_total{answer="lease"}`)
	s.Kill()
	out := pace(t, nodes[:1], []float64{200}, 500*time.Millisecond, request("lease", "big=b"))
	after, _ := scrapeMetric(t, p, `ratelimit_lease_decisions_total{answer="lease"}`)
	t.Logf("Redis down: %d admitted, %d refused, %d errors, %.0f from the lease, p99 %v", out.admitted, out.refused, out.errors, after-before, out.p99())
	if out.errors > 0 || out.refused > 0 {
		t.Errorf("%d errors and %d refusals from a lease of 166 tokens, want none (first error: %v)", out.errors, out.refused, out.firstErr)
	}
	if after-before < float64(out.admitted)/2 {
		t.Errorf("%.0f of %d answers came from the lease", after-before, out.admitted)
	}
	if d := out.p99(); d > 20*time.Millisecond {
		t.Errorf("p99 %v with Redis down, want within Envoy's 20ms", d)
	}
	// Limiting continues: the fallback's share of tiny (5 a minute).
	tiny := pace(t, nodes[:1], []float64{100}, 200*time.Millisecond, request("lease", "tiny=x"))
	t.Logf("tiny with Redis down: %d admitted, %d refused, %d errors", tiny.admitted, tiny.refused, tiny.errors)
	if tiny.errors > 0 || tiny.refused == 0 || tiny.admitted > 5 {
		t.Errorf("tiny with Redis down: %d admitted, %d refused, %d errors; want at most 5 admitted, refusals, no errors", tiny.admitted, tiny.refused, tiny.errors)
	}
}
