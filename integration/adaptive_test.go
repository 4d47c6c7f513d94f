//go:build integration

package integration

import (
	"context"
	"fmt"
	"net/http/httptest"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-rls/sluice/adaptive"
	"github.com/sluice-rls/sluice/internal/promtest"
	"github.com/sluice-rls/sluice/internal/redistest"
)

// TestAdaptiveFleet: two rls serve nodes on a real redis-server, with an
// adaptive policy on a real Prometheus scraping a target whose latency the
// test sets. One node acts; when the latency rises both nodes apply the
// lowered limit within a second of each other, down to min_scale and no
// further; when the actor is
// killed the other takes over, and when the latency recovers it brings the
// limit back to the rule file's, with trigger and restore audit events.
func TestAdaptiveFleet(t *testing.T) {
	reg := prometheus.NewRegistry()
	latency := prometheus.NewGauge(prometheus.GaugeOpts{Name: "backend_latency_p99_seconds", Help: "p99 latency"})
	reg.MustRegister(latency)
	latency.Set(0.5) // between the thresholds
	target := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer target.Close()
	prom := promtest.Start(t, strings.TrimPrefix(target.URL, "http://"))
	redis := redistest.Start(t)

	dir := t.TempDir()
	rules := writeFile(t, dir, "rules.yaml", overrideRulesYAML) // edge.user_id: 10/second
	tokens := writeFile(t, dir, "tokens", "ops:"+adminToken+"\n")
	policy := writeFile(t, dir, "adaptive.yaml", fmt.Sprintf(`prometheus: %s
lock_ttl: 1s
policies:
  - name: latency
    domain: edge
    rule: edge.user_id
    interval: 300ms
    cooldown: 300ms
    min_scale: 0.5
    signals:
      - {name: p99, query: 'max(backend_latency_p99_seconds)', lower_above: 1, raise_below: 0.2}
`, prom.URL()))
	args := []string{"--config", rules, "--redis", "redis://" + redis.Addr(), "--admin-token-file", tokens, "--adaptive-config", policy}
	nodes := []*rlsProcess{startRLS(t, args...), startRLS(t, args...)}

	// actor is the index of the one node acting, -1 when none or several
	// do (a holder stalled past the lock's TTL believes it acts until its
	// next renewal fails).
	actor := func() int {
		who := -1
		for i, n := range nodes {
			if v, ok := scrapeMetric(t, n, "ratelimit_adaptive_actor"); ok && v == 1 {
				if who >= 0 {
					return -1
				}
				who = i
			}
		}
		return who
	}
	first := -1
	pollFor(t, 10*time.Second, "one actor", func() bool { first = actor(); return first >= 0 })
	limit := func(n *rlsProcess) uint32 {
		return n.Check(t, "edge", "user_id=u1").GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
	}

	// Prometheus has scraped the target before the latency rises.
	src, err := adaptive.NewPrometheus(prom.URL(), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	promtest.WaitFor(t, 20*time.Second, func(ctx context.Context) error {
		if v, err := src.Query(ctx, "max(backend_latency_p99_seconds)"); err != nil || v != 0.5 {
			return fmt.Errorf("p99 %v, %v; want 0.5 scraped", v, err)
		}
		return nil
	})
	latency.Set(2)
	rose := time.Now()
	// Both nodes apply the actor's first change within a second of each
	// other (the overrides' propagation: a notice, or the 500 ms resync).
	var lowered [2]time.Time
	pollFor(t, 20*time.Second, "the lowered limit on every node", func() bool {
		for i, n := range nodes {
			if lowered[i].IsZero() && limit(n) < 10 {
				lowered[i] = time.Now()
			}
		}
		return !lowered[0].IsZero() && !lowered[1].IsZero()
	})
	if d := lowered[0].Sub(lowered[1]).Abs(); d > time.Second {
		t.Errorf("the nodes applied the lowered limit %v apart, want within a second", d)
	}
	t.Logf("the nodes applied the lowered limit %v apart, %v after the latency rose (scrape every %v, interval 300ms)",
		lowered[0].Sub(lowered[1]).Abs().Round(time.Millisecond), lowered[0].Sub(rose).Round(time.Millisecond), promtest.ScrapeInterval)
	for _, n := range nodes {
		pollFor(t, 10*time.Second, "min_scale reached", func() bool { return overridesHave(n, "scale ×0.5 on rule edge.user_id") })
		if got := limit(n); got != 5 {
			t.Errorf("at min_scale 0.5: limit %d/second, want 5", got)
		}
	}
	if v, ok := scrapeMetric(t, nodes[1-first], `ratelimit_adaptive_triggered{policy="latency"}`); !ok || v != 1 {
		t.Errorf("the other node's ratelimit_adaptive_triggered = %v, want 1", v)
	}

	// The actor dies: the other node takes over within the lock's TTL.
	nodes[first].Signal(t, syscall.SIGKILL)
	_ = nodes[first].Wait(t, 10*time.Second)
	dead, other := nodes[first], nodes[1-first]
	nodes = []*rlsProcess{other}
	pollFor(t, 10*time.Second, "the other node acting", func() bool { return actor() == 0 })
	if got := limit(other); got != 5 {
		t.Errorf("after the handover: limit %d/second, want 5 (the new actor starts from the stored scale)", got)
	}

	latency.Set(0.1)
	pollFor(t, 30*time.Second, "the rule file's limit back", func() bool { return limit(other) == 10 && !overridesHave(other, "scale") })
	// The restore's log line may still be on its way from the node's
	// stderr when the limit is back.
	for _, want := range []string{"kind=adaptive.trigger", "kind=adaptive.restore", "p99=2 above 1", "kind=override.set", "kind=override.remove"} {
		pollFor(t, 10*time.Second, "the nodes' logs with "+want, func() bool {
			return strings.Contains(dead.Log()+other.Log(), want)
		})
	}
	// The node that was not the first actor applied its changes.
	if !regexp.MustCompile(`kind=applied [^\n]*author=adaptive`).MatchString(other.Log()) {
		t.Errorf("the other node's log has no applied event of the actor's change")
	}
	// The trail in Redis holds them too, and rls audit --kind 'adaptive.*'
	// prints them and nothing else.
	var out string
	pollFor(t, 10*time.Second, "rls audit --kind 'adaptive.*' with a trigger and a restore", func() bool {
		var code int
		out, _, code = runRLS(t, "audit", "--redis", "redis://"+redis.Addr(), "--kind", "adaptive.*", "--count", "0")
		return code == 0 && strings.Contains(out, " adaptive.trigger ") && strings.Contains(out, " adaptive.restore ")
	})
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		if !strings.Contains(line, " adaptive.") || !strings.Contains(line, "author=adaptive") || !strings.Contains(line, "subject=latency") {
			t.Errorf("rls audit --kind 'adaptive.*' printed %q", line)
		}
	}
}
