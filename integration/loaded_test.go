//go:build integration

package integration

import (
	"fmt"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-rls/sluice/internal/redistest"
)

// loadedRules: one shared global limit, driven at twice its rate.
const loadedRules = `domain: loaded
descriptors:
  - key: shared
    rate_limit: {unit: second, requests_per_unit: 50, burst: 100}
`

const (
	loadedRate  = 50.0
	loadedBurst = 100.0
	// loadedTime is how long the load runs.
	loadedTime = 10 * time.Second
	// loadedOver is the over-admission the docs give for default flags on
	// a saturated machine (docs/operations.md, "Measured"): the fleet
	// admits at most burst + rate × T, plus this share of it. Admitting
	// every timed-out request would pass it only on a quiet machine.
	loadedOver = 0.50
	// loadedSwitches bounds the switches to fallback of the three nodes
	// together in loadedTime: the old rule made 9 on a moderately loaded
	// machine; the probe lets through only stalls of a whole second.
	loadedSwitches = 6
)

// startCPUHog keeps every one of n cores busy with a shell loop, bounded by
// d (timeout(1)) and killed at the test's end by its process group. It is
// the load of a busy CI machine, made sure.
func startCPUHog(t *testing.T, n int, d time.Duration) {
	t.Helper()
	for range n {
		cmd := exec.Command("timeout", fmt.Sprint(int(d.Seconds())), "sh", "-c", "while :; do :; done")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatalf("CPU hog: %v", err)
		}
		pid := cmd.Process.Pid
		t.Cleanup(func() {
			_ = syscall.Kill(-pid, syscall.SIGKILL) // timeout and its loop
			_ = cmd.Wait()
		})
	}
}

// admittedBy returns the requests of the loaded rule that p admitted by
// layer (result ok or near_limit).
func admittedBy(t *testing.T, p *rlsProcess, layer string) float64 {
	t.Helper()
	var n float64
	for _, result := range []string{"ok", "near_limit"} {
		v, _ := scrapeMetric(t, p, fmt.Sprintf(`ratelimit_decisions_total{domain="loaded",gray="false",layer=%q,result=%q,rule="loaded.shared"}`, layer, result))
		n += v
	}
	return n
}

// TestLoadedMachineStaysOnRedis runs three nodes with default flags (the
// 10ms --redis-timeout) on one Redis while a CPU hog keeps both cores busy,
// and drives one global bucket at twice its rate for 10 s, open loop: calls
// that miss the deadline on a starved CPU are no dead Redis, so no node
// switches to its fallback more than the rule allows, and the fleet admits
// within the documented bound.
func TestLoadedMachineStaysOnRedis(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	rules := writeFile(t, t.TempDir(), "rules.yaml", loadedRules)
	args := []string{"--redis", "redis://" + s.Addr() + "/0", "--config", rules}
	nodes := []*rlsProcess{startRLS(t, args...), startRLS(t, args...), startRLS(t, args...)}
	for i, p := range nodes {
		pollFor(t, startTimeout, fmt.Sprintf("node %d counting 3 live nodes", i), func() bool {
			v, _ := scrapeMetric(t, p, "ratelimit_live_nodes")
			return v == 3
		})
		ask(t, p, "loaded", "shared=warm-up") // dial and load the script
	}
	before := make([]float64, len(nodes))
	for i, p := range nodes {
		before[i] = metricValue(t, p, toFallbackSeries)
	}

	startCPUHog(t, 2, loadedTime+5*time.Second)
	per := 2 * loadedRate / float64(len(nodes))
	out := pace(t, nodes, []float64{per, per, per}, loadedTime, request("loaded", "shared=all"))

	elapsed := out.last.Sub(out.first)
	bound := loadedBurst + loadedRate*elapsed.Seconds()
	var switches, timeouts, fromShare float64
	for i, p := range nodes {
		sw := metricValue(t, p, toFallbackSeries) - before[i]
		to := metricValue(t, p, `ratelimit_redis_errors_total{kind="timeout"}`)
		share := admittedBy(t, p, "fallback")
		switches += sw
		timeouts += to
		fromShare += share
		down, _ := scrapeMetric(t, p, `ratelimit_fallback_stall_probes_total{result="down"}`)
		up, _ := scrapeMetric(t, p, `ratelimit_fallback_stall_probes_total{result="up"}`)
		t.Logf("node %d: %v switches to fallback (%.1f a minute), %v Redis timeouts, stall probes %v down / %v up, %v admitted by Redis, %v by its share",
			i, sw, sw*60/elapsed.Seconds(), to, down, up,
			admittedBy(t, p, "global"), share)
		// Each node's share: burst/N + rate/N × T.
		if limit := (loadedBurst + loadedRate*elapsed.Seconds()) / float64(len(nodes)); share > limit+1 {
			t.Errorf("node %d admitted %v from its share, over burst/N + rate/N × T = %.0f", i, share, limit)
		}
	}
	t.Logf("3 nodes at twice the rate for %v beside a CPU hog: admitted %d of %d (%+.1f%% over burst + rate × T = %.0f; %v of them by the nodes' shares), errors %d; latency p50 %v, p99 %v; switches %v, timeouts %v",
		elapsed.Round(time.Millisecond), out.admitted, out.admitted+out.refused+out.errors, 100*(float64(out.admitted)-bound)/bound, bound,
		fromShare, out.errors, out.quantile(0.5), out.p99(), switches, timeouts)
	if out.errors > 0 {
		t.Errorf("%d errors, want 0; first: %v", out.errors, out.firstErr)
	}
	// Redis never admits over burst + rate × T; only the shares add to it.
	if float64(out.admitted) > bound+fromShare {
		t.Errorf("admitted %d, over burst + rate × T + what the shares admitted = %.0f", out.admitted, bound+fromShare)
	}
	if switches > loadedSwitches {
		t.Errorf("%v switches to fallback in %v, want at most %d", switches, elapsed.Round(time.Millisecond), loadedSwitches)
	}
	if limit := bound * (1 + loadedOver); float64(out.admitted) > limit {
		t.Errorf("admitted %d, over (burst + rate × T) × %.2f = %.0f", out.admitted, 1+loadedOver, limit)
	}
}
