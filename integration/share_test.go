//go:build integration

package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluice-rls/sluice/internal/redistest"
)

// shareRules is leaseShared's rule with half of it held as standing
// shares, once exact and once leased behind them.
const shareRules = `domain: share
descriptors:
  - key: exact
    rate_limit: {unit: second, requests_per_unit: 50, burst: 50, share: 0.5}
  - key: leased
    rate_limit: {unit: second, requests_per_unit: 50, burst: 50, share: 0.5, consistency: leased}
`

// TestShareNeverOver drives a rule with a share at twice its rate, spread
// evenly over three built nodes on one real redis-server for 10 s: the
// fleet admits no more than burst + rate × T, and the shares answer.
//
// The floor is 95% of what Redis' part and the three nodes' shares of n
// admit together (shares sized by n from the registry's admission).
func TestShareNeverOver(t *testing.T) {
	t.Parallel()
	for _, rule := range []string{"exact", "leased"} {
		t.Run(rule, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			nodes := leaseNodesOn(t, "redis://"+srv.Addr()+"/0", shareRules, "--redis-timeout", neverOverTimeout)
			n := waitShares(t, nodes)
			out := pace(t, nodes, []float64{2 * leaseShared / 3, 2 * leaseShared / 3, 2 * leaseShared / 3}, neverOverTime, request("share", rule+"=all"))
			checkShareBound(t, out, leaseShared, leaseShared, 1-f+3*f/n)
			checkNoFallback(t, nodes)
			var byShare float64
			for _, p := range nodes {
				v, _ := scrapeMetric(t, p, `ratelimit_share_decisions_total{answer="share"}`)
				byShare += v
			}
			t.Logf("decisions answered by a share alone: %.0f of %d", byShare, len(out.latencies))
			if byShare == 0 {
				t.Error("no decision was answered by a share")
			}
		})
	}
}

// TestShareSkew is TestShareNeverOver with 90% of the traffic on one node:
// the fleet admits at least what that node's share and Redis' part give
// (the worst case of skew, f/n + 1 − f of the limit), never more than the
// limit. The share of the bound it reaches is docs/config.md's figure.
func TestShareSkew(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	nodes := leaseNodesOn(t, "redis://"+srv.Addr()+"/0", shareRules, "--redis-timeout", neverOverTimeout)
	n := waitShares(t, nodes)
	out := pace(t, nodes, []float64{0.9 * 2 * leaseShared, 0.05 * 2 * leaseShared, 0.05 * 2 * leaseShared}, neverOverTime, request("share", "exact=all"))
	checkShareBound(t, out, leaseShared, leaseShared, 1-f+f/n)
	checkNoFallback(t, nodes)
}

// waitShares waits until every node holds a share sized for all of them
// and returns the largest n they size it by.
func waitShares(t *testing.T, nodes []*rlsProcess) float64 {
	t.Helper()
	var n float64
	for i, p := range nodes {
		pollFor(t, 15*time.Second, fmt.Sprintf("node %d holding a share of n ≥ %d", i, len(nodes)), func() bool {
			v, _ := scrapeMetric(t, p, "ratelimit_share_nodes")
			n = max(n, v)
			return v >= float64(len(nodes))
		})
	}
	return n
}

// f is shareRules' share.
const f = 0.5

// checkShareBound asserts admitted ≤ burst + rate × T, as checkNeverOver,
// and admitted ≥ 95% of part × (burst + rate × T') − f × burst: part is the
// part of the limit the nodes can reach, and the shares start empty when
// granted (the load starts as the last node is admitted), which takes at
// most their burst, f × burst, off it.
func checkShareBound(t *testing.T, out paced, burst, rate, part float64) {
	t.Helper()
	elapsed, offered := out.last.Sub(out.first), out.lastSent.Sub(out.first)
	bound := burst + rate*elapsed.Seconds()
	floor := 0.95 * (part*(burst+rate*offered.Seconds()) - f*burst)
	t.Logf("admitted %d, refused %d, errors %d: %.1f%% of burst + rate × T = %.0f (T %v); floor %.0f; latency p50 %v, p99 %v",
		out.admitted, out.refused, out.errors, 100*float64(out.admitted)/bound, bound, elapsed.Round(time.Millisecond), floor, out.quantile(0.5), out.p99())
	if out.errors > 0 {
		t.Errorf("%d errors, want 0; first: %v", out.errors, out.firstErr)
	}
	if float64(out.admitted) > bound {
		t.Errorf("admitted %d, over burst + rate × T = %.1f", out.admitted, bound)
	}
	if float64(out.admitted) < floor {
		t.Errorf("admitted %d, under %.1f", out.admitted, floor)
	}
}
