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
// runs its own Redis and nodes. The never-over tests run 10 s, the leased
// layer's goal; the others a second or two.
const leaseRules = `domain: lease
descriptors:
  - key: shared
    rate_limit: {unit: second, requests_per_unit: 50, burst: 50, consistency: leased}
  - key: kill
    rate_limit: {unit: second, requests_per_unit: 60, burst: 600, consistency: leased}
  - key: term
    rate_limit: {unit: minute, requests_per_unit: 10, burst: 100, consistency: leased}
  - key: big
    rate_limit: {unit: second, requests_per_unit: 6000, burst: 6000, consistency: leased}
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
		pollFor(t, startTimeout, fmt.Sprintf("node %d counting 3 live nodes", i), func() bool {
			v, _ := scrapeMetric(t, p, "ratelimit_live_nodes")
			return v == 3
		})
	}
	return nodes
}

// paced is the outcome of an open-loop load.
type paced struct {
	admitted, refused, errors int
	// first is before the first call was sent, lastSent when the last was
	// sent, last when the last answer arrived.
	first, lastSent, last time.Time
	latencies             []time.Duration
	firstErr              error
}

// add counts one call, sent at t0 and answered at t1.
func (p *paced) add(t0, t1 time.Time, resp *rlsv3.RateLimitResponse, err error) {
	p.latencies = append(p.latencies, t1.Sub(t0))
	if t0.After(p.lastSent) {
		p.lastSent = t0
	}
	if t1.After(p.last) {
		p.last = t1
	}
	switch {
	case err != nil:
		p.errors++
		if p.firstErr == nil {
			p.firstErr = err
		}
	case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
		p.admitted++
	default:
		p.refused++
	}
}

// paceTimeout bounds each call of pace: far above any answer of a loaded
// machine, and above the never-over tests' --redis-timeout, so that an
// error is the server's answer, not the test's impatience.
const paceTimeout = 10 * time.Second

// pace sends req to each node at its rate (requests per second) for d, and
// adds up the answers. It is an open loop: each call starts at its time on
// a goroutine of its own, whatever earlier calls' answers, so a slow
// answer (a loaded machine) delays no other call and the offered load
// stays what the rates say. A call starts late only when the test process
// itself is not scheduled in time, and then at once.
func pace(t *testing.T, nodes []*rlsProcess, rates []float64, d time.Duration, req *rlsv3.RateLimitRequest) paced {
	t.Helper()
	var mu sync.Mutex
	var out paced
	var wg sync.WaitGroup
	call := func(p *rlsProcess) {
		ctx, cancel := context.WithTimeout(context.Background(), paceTimeout)
		t0 := time.Now()
		resp, err := p.Client.ShouldRateLimit(ctx, req)
		t1 := time.Now()
		cancel()
		mu.Lock()
		defer mu.Unlock()
		out.add(t0, t1, resp, err)
	}
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
				wg.Go(func() { call(p) })
			}
		})
	}
	wg.Wait()
	return out
}

// p99 returns the 99th percentile latency.
func (p paced) p99() time.Duration { return p.quantile(0.99) }

// quantile returns the latency at quantile q (0 to 1) of the calls.
func (p paced) quantile(q float64) time.Duration {
	if len(p.latencies) == 0 {
		return 0
	}
	l := append([]time.Duration(nil), p.latencies...)
	sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
	return l[min(len(l)-1, int(float64(len(l))*q))]
}

// leaseShared is the rate (per second) and burst of the shared rule of
// leaseRules and clusterLeaseRules, which the never-over tests drive at
// twice its rate. At 200/s, three race-built nodes answering 400 requests a
// second on a loaded 2-core machine fell seconds behind (p50 8 s): calls
// hit the 10 s pace timeout and the runs failed on the machine, not on the
// leases. The bounds (burst + rate × T, 95% of it) scale with the rate.
const leaseShared = 50.0

// neverOverTime is how long the never-over tests drive a bucket, as issue
// 13 asks.
const neverOverTime = 10 * time.Second

// neverOverTimeout is the nodes' --redis-timeout in the never-over tests:
// far above any Redis call on a loaded CI machine, so that the fail-open
// switch, whose share the bounds do not cover, never answers there
// (checkNoFallback makes sure).
const neverOverTimeout = "2s"

// checkNeverOver asserts admitted ≤ burst + rate × T, T from before the
// first call was sent to after the last answer arrived, and admitted ≥ 95%
// of burst + rate × T', T' from then until the last call was sent.
//
// The upper bound is the design's, exactly: the bucket is full before the
// first call, and every admitted token left it (in a take or a lease)
// within T. The lower one is what pace offers: twice the rate until the
// last call is sent, whatever the answers' lag (an open loop), so only
// tokens parked in leases go unspent; T' leaves out the last answers' lag,
// which a loaded machine stretches and during which nothing is offered.
func checkNeverOver(t *testing.T, out paced, burst, rate float64) {
	t.Helper()
	elapsed, offered := out.last.Sub(out.first), out.lastSent.Sub(out.first)
	bound := burst + rate*elapsed.Seconds()
	floor := 0.95 * (burst + rate*offered.Seconds())
	t.Logf("admitted %d, refused %d, errors %d: %.1f%% of burst + rate × T = %.0f (T %v to the last answer; %v to the last call); latency p50 %v, p99 %v, max %v",
		out.admitted, out.refused, out.errors, 100*float64(out.admitted)/bound, bound, elapsed.Round(time.Millisecond), offered.Round(time.Millisecond),
		out.quantile(0.5), out.p99(), out.quantile(1))
	if out.errors > 0 {
		t.Errorf("%d errors, want 0; first: %v", out.errors, out.firstErr)
	}
	if float64(out.admitted) > bound {
		t.Errorf("admitted %d, over burst + rate × T = %.1f", out.admitted, bound)
	}
	if float64(out.admitted) < floor {
		t.Errorf("admitted %d, under 95%% of burst + rate × %v = %.1f", out.admitted, offered, floor)
	}
}

// checkNoFallback fails the test if a node's fail-open switch answered:
// its share is not the leased layer's, and the never-over bounds are not
// its bounds.
func checkNoFallback(t *testing.T, nodes []*rlsProcess) {
	t.Helper()
	for i, p := range nodes {
		if v, _ := scrapeMetric(t, p, `ratelimit_fallback_transitions_total{to="fallback"}`); v != 0 {
			t.Errorf("node %d switched to its fallback %v times (a Redis call over %s): the bounds are the leased layer's", i, v, neverOverTimeout)
		}
	}
}

// TestLeaseNeverOver drives a leased bucket at twice its rate, spread
// evenly over three nodes for 10 s: the fleet admits no more than
// burst + rate × T, and at least 95% of it.
func TestLeaseNeverOver(t *testing.T) {
	t.Parallel()
	_, nodes := leaseNodes(t, "--redis-timeout", neverOverTimeout)
	out := pace(t, nodes, []float64{2 * leaseShared / 3, 2 * leaseShared / 3, 2 * leaseShared / 3}, neverOverTime, request("lease", "shared=all"))
	checkNeverOver(t, out, leaseShared, leaseShared)
	checkNoFallback(t, nodes)
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
	t.Parallel()
	_, nodes := leaseNodes(t, "--redis-timeout", neverOverTimeout)
	out := pace(t, nodes, []float64{0.9 * 2 * leaseShared, 0.05 * 2 * leaseShared, 0.05 * 2 * leaseShared}, neverOverTime, request("lease", "shared=all"))
	checkNeverOver(t, out, leaseShared, leaseShared)
	checkNoFallback(t, nodes)
}

// TestLeaseSIGKILL kills a node holding a lease: the fleet never goes
// over, and its lost tokens are back within one lease period (the bucket
// refills them: a lease is at most what the limit refills in one period).
func TestLeaseSIGKILL(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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

// envoyTimeout is Envoy's default deadline for a rate-limit call.
const envoyTimeout = 20 * time.Millisecond

// decisionTimes reads p's ratelimit_request_duration_seconds: requests
// decided so far, and those decided within envoyTimeout (a bucket bound of
// the histogram), as the server timed its own decision path.
func decisionTimes(t *testing.T, p *rlsProcess) (count, within float64) {
	t.Helper()
	count, ok1 := scrapeMetric(t, p, "ratelimit_request_duration_seconds_count")
	within, ok2 := scrapeMetric(t, p, `ratelimit_request_duration_seconds_bucket{le="0.02"}`)
	if !ok1 || !ok2 {
		t.Fatalf("no ratelimit_request_duration_seconds count or le=\"0.02\" bucket on /metrics")
	}
	return count, within
}

// checkDecidedWithin asserts that at least 99% of the requests p decided
// since (count0, within0) took the server envoyTimeout or less. The
// server's own timing leaves out the test client's scheduling and gRPC,
// which on a loaded machine pass 20 ms at p99 (measured: 22–97 ms at load
// average 8–11 on 2 cores); the calls come one at a time (serial), so no
// request queues behind another in the server. A decision that does no
// I/O then passes 20 ms only when the race-built binary is preempted in
// it (measured at load average 8–11: none of 4,800 serial decisions; 1 of
// 100 at most with concurrent calls). So 99% of a phase's 400 calls leaves
// room for a few preemptions, not for a wait on Redis, which would hold up
// the decisions behind it (the lease phase also asserts, exactly, that
// none waited).
func checkDecidedWithin(t *testing.T, p *rlsProcess, what string, count0, within0 float64) {
	t.Helper()
	count, within := decisionTimes(t, p)
	n, in := count-count0, within-within0
	t.Logf("%s: %.0f of %.0f requests decided within %v by the server's clock", what, in, n, envoyTimeout)
	if n == 0 || in < 0.99*n {
		t.Errorf("%s: %.0f of %.0f requests decided within Envoy's %v, want at least 99%%", what, in, n, envoyTimeout)
	}
}

// serial sends req to p n times, one call after the other: the server
// decides one request at a time, so the time it takes is its decision path
// alone, never a queue of the test's own making.
func serial(t *testing.T, p *rlsProcess, n int, req *rlsv3.RateLimitRequest) paced {
	t.Helper()
	out := paced{first: time.Now()}
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), paceTimeout)
		t0 := time.Now()
		resp, err := p.Client.ShouldRateLimit(ctx, req)
		t1 := time.Now()
		cancel()
		out.add(t0, t1, resp, err)
	}
	return out
}

// redisDownCalls is how many requests each phase of TestLeaseRedisDown
// sends: 1% of them is 4.
const redisDownCalls = 400

// TestLeaseRedisDown stops Redis while a node holds a lease: its tokens
// keep answering, without errors and without waiting on Redis, within
// Envoy's 20 ms; past them the fail-open switch answers, and limiting
// continues.
func TestLeaseRedisDown(t *testing.T) {
	t.Parallel()
	// A 10 s lease period: the lease cannot end, and go back to Redis,
	// before Redis stops, however slow the machine. The lease is the most
	// a lease may be, 1000 (5998 left / (2 × 3 nodes) = 999, capped at
	// 1000): more than the phase's calls.
	s, nodes := leaseNodes(t, "--lease-period", "10s")
	p := nodes[0]
	for i := range 2 { // a key's first decision leases nothing; its second does
		if r := p.Check(t, "lease", "big=b"); r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request %d: %v", i, r.GetOverallCode())
		}
	}
	if v, _ := scrapeMetric(t, p, `ratelimit_lease_tokens_total{direction="leased"}`); v < redisDownCalls {
		t.Fatalf("node 0 leased %v tokens, want at least %d", v, redisDownCalls)
	}
	fromLease := func() (lease, waited float64) {
		lease, _ = scrapeMetric(t, p, `ratelimit_lease_decisions_total{answer="lease"}`)
		waited, _ = scrapeMetric(t, p, `ratelimit_lease_decisions_total{answer="redis"}`)
		return lease, waited
	}
	lease0, waited0 := fromLease()
	count0, within0 := decisionTimes(t, p)
	s.Kill()
	out := serial(t, p, redisDownCalls, request("lease", "big=b"))
	lease1, waited1 := fromLease()
	t.Logf("Redis down: %d admitted, %d refused, %d errors, %.0f from the lease, %.0f waited on Redis; client-side p99 %v",
		out.admitted, out.refused, out.errors, lease1-lease0, waited1-waited0, out.p99())
	if out.errors > 0 || out.refused > 0 || out.admitted == 0 {
		t.Errorf("%d admitted, %d errors and %d refusals from the lease, want all admitted (first error: %v)", out.admitted, out.errors, out.refused, out.firstErr)
	}
	if lease1-lease0 != float64(out.admitted) || waited1 != waited0 {
		t.Errorf("%.0f of %d answers came from the lease, %.0f waited on Redis; want all from the lease, none waiting", lease1-lease0, out.admitted, waited1-waited0)
	}
	checkDecidedWithin(t, p, "answers from the lease", count0, within0)
	// Limiting continues: the fallback's share of tiny (5 a minute). The
	// first decision of tiny is Redis' (a key's first decision is exact):
	// it fails, and turns the fail-open switch, which answers it and every
	// later one.
	t0 := time.Now()
	admitted := 0
	if p.Check(t, "lease", "tiny=x").GetOverallCode() == rlsv3.RateLimitResponse_OK {
		admitted++
	}
	t.Logf("tiny's first decision with Redis down, the switch's turn: %v on the client's clock", time.Since(t0))
	count0, within0 = decisionTimes(t, p)
	tiny := serial(t, p, redisDownCalls, request("lease", "tiny=x"))
	admitted += tiny.admitted
	t.Logf("tiny with Redis down: %d admitted, %d refused, %d errors; client-side p99 %v", admitted, tiny.refused, tiny.errors, tiny.p99())
	if tiny.errors > 0 || tiny.refused == 0 || admitted > 5 {
		t.Errorf("tiny with Redis down: %d admitted, %d refused, %d errors; want at most 5 admitted, refusals, no errors", admitted, tiny.refused, tiny.errors)
	}
	checkDecidedWithin(t, p, "answers of the fail-open switch", count0, within0)
}
