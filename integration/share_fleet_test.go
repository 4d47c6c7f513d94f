//go:build integration

package integration

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-rls/sluice/internal/redistest"
)

// The tests of this file are TestShareNeverOver (shareRules, f = 0.5,
// open-loop load at twice the rate) with the fleet or Redis changing
// mid-run. Each asserts admitted ≤ a bound derived in its comment, and a
// floor that shows the shares still answer. Each runs one mode of Redis'
// part, exact or leased in turn: the shares in front are the same, and
// TestShareNeverOver runs both.
const (
	fleetShare = 0.5              // shareRules' f
	fleetTime  = 10 * time.Second // the load of each run but the join-and-kill one
)

// fleet is the set of nodes an open-loop load spreads over, which a test
// changes mid-run.
type fleet struct {
	mu    sync.Mutex
	nodes []*rlsProcess
}

func (f *fleet) pick(n int) *rlsProcess {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.nodes[n%len(f.nodes)]
}

func (f *fleet) add(p *rlsProcess) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodes = append(f.nodes, p)
}

func (f *fleet) remove(p *rlsProcess) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodes = slices.DeleteFunc(f.nodes, func(q *rlsProcess) bool { return q == p })
}

// fleetRun is the outcome of paceFleet: pace's, with the errors by node.
type fleetRun struct {
	paced
	errorsOn map[*rlsProcess]int
}

// paceFleet sends req at rate calls a second for d from start, call n to
// the fleet's node n mod its size at that moment: an open loop, as pace.
func paceFleet(fl *fleet, rate float64, d time.Duration, req *rlsv3.RateLimitRequest, start time.Time) fleetRun {
	var mu sync.Mutex
	out := fleetRun{errorsOn: map[*rlsProcess]int{}}
	out.first = start
	var wg sync.WaitGroup
	every := time.Duration(float64(time.Second) / rate)
	for n := 0; time.Duration(n)*every < d; n++ {
		time.Sleep(time.Until(start.Add(time.Duration(n) * every)))
		p := fl.pick(n)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), paceTimeout)
			defer cancel()
			t0 := time.Now()
			resp, err := p.Client.ShouldRateLimit(ctx, req)
			t1 := time.Now()
			mu.Lock()
			defer mu.Unlock()
			out.add(t0, t1, resp, err)
			if err != nil {
				out.errorsOn[p]++
			}
		})
	}
	wg.Wait()
	return out
}

// fleetArgs writes rules into a directory of their own and returns the
// flags of a node serving them on srv, and the rule file.
func fleetArgs(t *testing.T, srv *redistest.Server, rules string) ([]string, string) {
	t.Helper()
	path := writeFile(t, t.TempDir(), "rules.yaml", rules)
	return []string{"--redis", "redis://" + srv.Addr() + "/0", "--config", path, "--redis-timeout", neverOverTimeout}, path
}

// startFleet starts three nodes with args and waits until each counts
// three live nodes and holds a share sized for all of them.
func startFleet(t *testing.T, args []string) []*rlsProcess {
	t.Helper()
	nodes := []*rlsProcess{startRLS(t, args...), startRLS(t, args...), startRLS(t, args...)}
	for i, p := range nodes {
		pollFor(t, startTimeout, fmt.Sprintf("node %d counting 3 live nodes", i), func() bool {
			v, _ := scrapeMetric(t, p, "ratelimit_live_nodes")
			return v == 3
		})
	}
	waitShares(t, nodes)
	return nodes
}

// shareAnswers is how many decisions the nodes' shares answered alone.
func shareAnswers(t *testing.T, nodes []*rlsProcess) float64 {
	t.Helper()
	var sum float64
	for _, p := range nodes {
		v, _ := scrapeMetric(t, p, `ratelimit_share_decisions_total{answer="share"}`)
		sum += v
	}
	return sum
}

// checkFleetBound asserts admitted ≤ bound and admitted ≥ floor, and no
// error but the tolerated ones.
func checkFleetBound(t *testing.T, out paced, tolerated int, bound, floor float64) {
	t.Helper()
	elapsed := out.last.Sub(out.first)
	t.Logf("admitted %d, refused %d, errors %d: %.1f%% of the bound %.0f (T %v); floor %.0f; latency p50 %v, p99 %v, max %v",
		out.admitted, out.refused, out.errors, 100*float64(out.admitted)/bound, bound, elapsed.Round(time.Millisecond), floor,
		out.quantile(0.5), out.p99(), out.quantile(1))
	if out.errors > tolerated {
		t.Errorf("%d errors, want at most %d; first: %v", out.errors, tolerated, out.firstErr)
	}
	if float64(out.admitted) > bound {
		t.Errorf("admitted %d, over the bound %.1f", out.admitted, bound)
	}
	if float64(out.admitted) < floor {
		t.Errorf("admitted %d, under the floor %.1f", out.admitted, floor)
	}
}

// TestShareFleetJoinAndKill drives shareRules at twice the rate over the
// fleet for 13 s: a 4th node joins at 1.5 s and gets its part of the load
// at once; once it holds a share, node 0 is SIGKILLed (its load moves to
// the others at that moment; the calls it had in flight fail, and only
// those may).
//
// The bound is burst + rate × T, with nothing added: a dead node's cell
// deficit is forgiven (decision 0021) only for what its cell does not
// refill within the registration's 3 s, and a cell of this rule
// (⌊f × burst / n⌋ = 8 tokens at f × rate / n = 8.3/s for n = 3) refills
// in a second.
//
// The floor is 95% of 1 − f + f × 3/4 of burst + rate × T': at least three
// nodes hold a share sized by n ≤ 4 throughout (the joining node is
// admitted only after the others count it; the dead one is counted until
// its entry expires), and Redis' part admits the rest of the traffic.
func TestShareFleetJoinAndKill(t *testing.T) {
	t.Parallel()
	for _, rule := range []string{"leased"} { // the other mode: TestShareNeverOver's
		t.Run(rule, func(t *testing.T) {
			t.Parallel()
			args, _ := fleetArgs(t, redistest.Start(t), shareRules)
			nodes := startFleet(t, args)
			fl := &fleet{nodes: slices.Clone(nodes)}
			start := time.Now()
			done := make(chan fleetRun, 1)
			go func() {
				done <- paceFleet(fl, 2*leaseShared, 13*time.Second, request("share", rule+"=all"), start)
			}()
			hold(1500 * time.Millisecond)
			fourth := startRLS(t, args...)
			fl.add(fourth)
			serving := time.Since(start)
			pollFor(t, 10*time.Second, "the 4th node holding a share of n ≥ 4", func() bool {
				v, _ := scrapeMetric(t, fourth, "ratelimit_share_nodes")
				return v >= 4
			})
			admitted := time.Since(start)
			fl.remove(nodes[0])
			if err := syscall.Kill(nodes[0].cmd.Process.Pid, syscall.SIGKILL); err != nil {
				t.Fatalf("SIGKILL node 0: %v", err)
			}
			_ = nodes[0].Wait(t, 5*time.Second)
			killed := time.Since(start)
			left := []*rlsProcess{nodes[1], nodes[2], fourth}
			for i, p := range left {
				pollFor(t, 10*time.Second, fmt.Sprintf("live node %d sizing its share by n = 3", i), func() bool {
					v, _ := scrapeMetric(t, p, "ratelimit_share_nodes")
					return v == 3
				})
			}
			grown := time.Since(start)
			out := <-done
			t.Logf("4th node serving at %v, holding a share at %v; node 0 SIGKILLed at %v; the three left at n = 3 at %v",
				serving.Round(time.Millisecond), admitted.Round(time.Millisecond), killed.Round(time.Millisecond), grown.Round(time.Millisecond))
			for p, n := range out.errorsOn {
				if p != nodes[0] {
					t.Errorf("%d errors on a live node", n)
				}
			}
			elapsed, offered := out.last.Sub(out.first), out.lastSent.Sub(out.first)
			part := 1 - fleetShare + fleetShare*3/4
			checkFleetBound(t, out.paced, out.errorsOn[nodes[0]], leaseShared+leaseShared*elapsed.Seconds(), 0.95*part*(leaseShared+leaseShared*offered.Seconds()))
			checkNoFallback(t, left)
			byShare, byFourth := shareAnswers(t, left), shareAnswers(t, []*rlsProcess{fourth})
			t.Logf("decisions answered by a share alone on the nodes alive at the end: %.0f, of which the 4th node's %.0f", byShare, byFourth)
			if byFourth == 0 {
				t.Error("the 4th node's share answered no decision")
			}
		})
	}
}

// TestShareFleetRedisFlush runs shareRules at twice the rate over three
// nodes for 10 s and sends FLUSHALL at 4 s.
//
// The bound is burst + rate × T + (1 − f) × burst: the flush drops Redis'
// part's bucket, which comes back full ("each bucket may admit one more
// burst", docs/operations.md), so Redis' part admits at most two of its
// bursts and (1 − f) × rate × T; the cells are in the nodes' memory, which
// the flush does not touch, and the registry settles without shrinking a
// holder's n (decision 0022), so they admit at most f × (burst + rate × T).
// The floor is TestShareNeverOver's (the holders keep their shares), and
// shares answer after the flush.
func TestShareFleetRedisFlush(t *testing.T) {
	t.Parallel()
	for _, rule := range []string{"exact"} { // the other mode: TestShareNeverOver's
		t.Run(rule, func(t *testing.T) {
			t.Parallel()
			r := disruptRedis(t, rule, "FLUSHALL", func(srv *redistest.Server) {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				if err := srv.Client().FlushAll(ctx).Err(); err != nil {
					t.Fatalf("FLUSHALL: %v", err)
				}
			})
			checkFleetBound(t, r.out.paced, 0, r.plain+(1-fleetShare)*leaseShared, r.floor)
			checkNoFallback(t, r.nodes)
		})
	}
}

// TestShareFleetRedisRestart is TestShareFleetRedisFlush with the
// redis-server killed and started again on its port at 4 s (nothing is
// persisted). While it is down the nodes answer Redis' part from their
// fallback, at their share of it among the N = 3 live nodes:
// ⌊(1 − f) × burst / N⌋ tokens refilling at (1 − f) × rate / N. Those
// buckets refill while the node is on Redis, so each switch to fallback
// may spend one more of them. The bound is TestShareFleetRedisFlush's plus
// ⌊(1 − f) × burst / N⌋ per switch of each node; the floor is that of
// TestShareFleetRedisFlush.
func TestShareFleetRedisRestart(t *testing.T) {
	t.Parallel()
	for _, rule := range []string{"leased"} { // the other mode: TestShareNeverOver's
		t.Run(rule, func(t *testing.T) {
			t.Parallel()
			r := disruptRedis(t, rule, "the restart", func(srv *redistest.Server) { srv.Restart() })
			var switches float64
			for _, p := range r.nodes {
				v, _ := scrapeMetric(t, p, `ratelimit_fallback_transitions_total{to="fallback"}`)
				switches += v
			}
			fallbackBurst := math.Floor((1 - fleetShare) * leaseShared / 3)
			t.Logf("switches to fallback %.0f", switches)
			checkFleetBound(t, r.out.paced, 0, r.plain+(1-fleetShare)*leaseShared+switches*fallbackBurst, r.floor)
		})
	}
}

// disrupted is what disruptRedis saw.
type disrupted struct {
	nodes []*rlsProcess
	out   fleetRun
	plain float64 // burst + rate × T
	floor float64 // TestShareNeverOver's: the holders keep their shares
}

// disruptRedis runs shareRules (consistency rule) at twice the rate over
// three nodes for fleetTime, calls disrupt on their redis-server at 4 s,
// and checks that shares answered decisions after it (what names it).
func disruptRedis(t *testing.T, rule, what string, disrupt func(*redistest.Server)) disrupted {
	t.Helper()
	srv := redistest.Start(t)
	args, _ := fleetArgs(t, srv, shareRules)
	nodes := startFleet(t, args)
	fl := &fleet{nodes: nodes}
	start := time.Now()
	done := make(chan fleetRun, 1)
	go func() { done <- paceFleet(fl, 2*leaseShared, fleetTime, request("share", rule+"=all"), start) }()
	hold(4 * time.Second)
	disrupt(srv)
	at := time.Since(start)
	before := shareAnswers(t, nodes)
	out := <-done
	after := shareAnswers(t, nodes)
	t.Logf("%s done at %v; decisions answered by a share alone: %.0f before it, %.0f after", what, at.Round(time.Millisecond), before, after-before)
	if after == before {
		t.Errorf("no decision was answered by a share after %s", what)
	}
	elapsed, offered := out.last.Sub(out.first), out.lastSent.Sub(out.first)
	plain := leaseShared + leaseShared*elapsed.Seconds()
	t.Logf("admitted − (burst + rate × T) = %.0f (Redis' part's burst: %.0f)", float64(out.admitted)-plain, (1-fleetShare)*leaseShared)
	return disrupted{nodes: nodes, out: out, plain: plain, floor: 0.95 * (leaseShared + leaseShared*offered.Seconds())}
}

// fleetRules is shareRules at rate requests a second, burst rate.
func fleetRules(rate int) string {
	return strings.ReplaceAll(shareRules, "requests_per_unit: 50, burst: 50", fmt.Sprintf("requests_per_unit: %d, burst: %d", rate, rate))
}

// TestShareFleetLimitLowered runs shareRules at 100 calls a second over
// three nodes for 10 s; at 4 s the rule file is rewritten (a new file
// renamed over it) with the limit lowered from r₁ = 50/s, burst b₁ = 50 to
// r₂ = 20/s, b₂ = 20, and the nodes reload it.
//
// The bound: let t₁ be when every node is seen serving the new rule (its
// second successful load), after its true switch. Until t₁ the nodes may
// disagree, and a bucket written under two limits admits at most the
// larger's (decision 0004): at most b₁ + r₁ × t₁. After t₁ every node
// writes r₂; a converted bucket keeps the tokens it lacked, so it holds no
// more than it did under r₁, and what it admits after t₁ is at most what
// it held at t₁ plus r₂ × (T − t₁). Both parts (Redis' and the cells) are
// derived from the limit, so the fleet admits at most
// b₁ + r₁ × t₁ + r₂ × (T − t₁): each period's rate × duration plus the
// larger burst.
//
// The floor: 95% of b₁ + r₁ × t_w + r₂ × (T' − t₁), t_w when the file was
// written, less b₁ − b₂: a bucket drained under r₁ converts into a debt
// of up to that.
func TestShareFleetLimitLowered(t *testing.T) {
	t.Parallel()
	const r1, r2 = 50.0, 20.0
	for _, rule := range []string{"exact"} { // the other mode: TestShareNeverOver's
		t.Run(rule, func(t *testing.T) {
			t.Parallel()
			args, path := fleetArgs(t, redistest.Start(t), fleetRules(r1))
			nodes := startFleet(t, args)
			fl := &fleet{nodes: nodes}
			start := time.Now()
			done := make(chan fleetRun, 1)
			go func() { done <- paceFleet(fl, 2*r1, fleetTime, request("share", rule+"=all"), start) }()
			hold(4 * time.Second)
			next := writeFile(t, filepath.Dir(path), "rules.yaml.next", fleetRules(r2))
			if err := os.Rename(next, path); err != nil {
				t.Fatal(err)
			}
			written := time.Since(start)
			for i, p := range nodes {
				pollFor(t, 5*time.Second, fmt.Sprintf("node %d reloading the lowered rule", i), func() bool {
					v, _ := scrapeMetric(t, p, `ratelimit_config_loads_total{result="success"}`)
					return v >= 2
				})
			}
			reloaded := time.Since(start)
			before := shareAnswers(t, nodes)
			out := <-done
			after := shareAnswers(t, nodes)
			t.Logf("rule file rewritten at %v, every node serving it at %v; decisions answered by a share alone: %.0f before, %.0f after",
				written.Round(time.Millisecond), reloaded.Round(time.Millisecond), before, after-before)
			elapsed, offered := out.last.Sub(out.first), out.lastSent.Sub(out.first)
			t1 := reloaded.Seconds()
			bound := r1 + r1*t1 + r2*(elapsed.Seconds()-t1)
			floor := 0.95*(r1+r1*written.Seconds()+r2*(offered.Seconds()-t1)) - (r1 - r2)
			checkFleetBound(t, out.paced, 0, bound, floor)
			checkNoFallback(t, nodes)
			if after == before {
				t.Error("no decision was answered by a share after the limit was lowered")
			}
		})
	}
}
