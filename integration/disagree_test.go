//go:build integration

package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluice-rls/sluice/internal/redistest"
)

// disagreeRules is one rule file of TestDisagreeingLimits: the same domain
// and rules on both nodes, with the numbers of one node. Each case has its
// own descriptor key, exact and leased.
func disagreeRules(burstCase, rateCase [2]int) string {
	s := "domain: split\ndescriptors:\n"
	for _, c := range []string{"exact", "leased"} {
		s += fmt.Sprintf("  - key: burst_%s\n    rate_limit: {unit: second, requests_per_unit: %d, burst: %d, consistency: %s}\n", c, burstCase[0], burstCase[1], c)
		s += fmt.Sprintf("  - key: rate_%s\n    rate_limit: {unit: second, requests_per_unit: %d, burst: %d, consistency: %s}\n", c, rateCase[0], rateCase[1], c)
		s += fmt.Sprintf("  - key: warm_%s\n    rate_limit: {unit: second, requests_per_unit: 1000, consistency: %s}\n", c, c)
	}
	return s
}

// disagreeCallRate and disagreeTime are the open loop of each case of
// TestDisagreeingLimits: calls a second over both nodes, and for how long.
// On the scripts that clamped a converted bucket to the caller's burst,
// about every other call was admitted (the larger limit's node hardly ever
// refused): some 600 of 1,200, against a bound of 300 when the nodes keep
// up; on a machine so loaded that the nodes answered 1 to 2 s late, 540 to
// 720 admitted of 1,500 sent in 2.5 s, against bounds of 490 to 590.
const (
	disagreeCallRate = 600.0
	disagreeTime     = 2 * time.Second
)

// TestDisagreeingLimits starts two nodes on one redis-server with
// different numbers for the same rules (a rollout, an xDS update or
// different overrides), 100/s burst 100 on one and burst 90 on the other,
// and 100/s burst 100 against 50/s burst 50, and sends calls alternating
// between them (an open loop, as pace): the fleet admits at most what the
// most generous limit allows, burst_max + rate_max × T, T from before the
// first call was sent to after the last answer arrived (the bucket is full
// before the first call and every admitted token left it within T; a
// loaded machine only lengthens T). Exact and leased mode.
func TestDisagreeingLimits(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	dir := t.TempDir()
	a := writeFile(t, dir, "a.yaml", disagreeRules([2]int{100, 100}, [2]int{100, 100}))
	b := writeFile(t, dir, "b.yaml", disagreeRules([2]int{100, 90}, [2]int{50, 50}))
	url := "redis://" + s.Addr() + "/0"
	nodes := []*rlsProcess{
		startRLS(t, "--redis", url, "--config", a, "--redis-timeout", neverOverTimeout),
		startRLS(t, "--redis", url, "--config", b, "--redis-timeout", neverOverTimeout),
	}
	for i, p := range nodes {
		// The leased share counts the live nodes.
		pollFor(t, startTimeout, fmt.Sprintf("node %d counting 2 live nodes", i), func() bool {
			v, _ := scrapeMetric(t, p, "ratelimit_live_nodes")
			return v == 2
		})
		// Warm the node's connections (gRPC, Redis, both scripts) on a
		// rule of its own, so that the first case's T is not its set-up.
		for _, k := range []string{"warm_exact", "warm_leased"} {
			p.Check(t, "split", k+"=u")
		}
	}
	for _, c := range []struct {
		key             string
		burstMax, least float64 // the larger burst; the smaller
	}{
		{"rate_exact", 100, 50},
		{"burst_exact", 100, 90},
		{"burst_leased", 100, 90},
		{"rate_leased", 100, 50},
	} {
		const rateMax = 100.0
		out := alternate(nodes, disagreeCallRate, disagreeTime, c.key)
		elapsed := out.last.Sub(out.first)
		bound := c.burstMax + rateMax*elapsed.Seconds()
		t.Logf("%s: admitted %d, refused %d, errors %d over %v: bound burst_max + rate_max × T = %.0f; latency p50 %v, p99 %v, max %v",
			c.key, out.admitted, out.refused, out.errors, elapsed.Round(time.Millisecond), bound, out.quantile(0.5), out.p99(), out.quantile(1))
		if out.errors > 0 {
			t.Errorf("%s: %d errors, want 0; first: %v", c.key, out.errors, out.firstErr)
		}
		if float64(out.admitted) > bound {
			t.Errorf("%s: the fleet admitted %d, over the most generous limit's burst_max + rate_max × T = %.1f (T %v)",
				c.key, out.admitted, bound, elapsed)
		}
		if float64(out.admitted) < c.least {
			t.Errorf("%s: the fleet admitted %d from a full bucket, under the smaller burst %.0f", c.key, out.admitted, c.least)
		}
	}
	checkNoFallback(t, nodes)
}

// alternate sends a request of descriptor key=u at rate calls a second
// for d, call n to node n mod len(nodes), as pace does: an open loop,
// each call on a goroutine of its own at its time (paceFleet over a fleet
// that does not change).
func alternate(nodes []*rlsProcess, rate float64, d time.Duration, key string) paced {
	return paceFleet(&fleet{nodes: nodes}, rate, d, request("split", key+"=u"), time.Now()).paced
}
