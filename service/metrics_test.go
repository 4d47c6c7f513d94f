package service_test

import (
	"strings"
	"testing"

	"github.com/sluice-rls/sluice/ruleset"
	"github.com/sluice-rls/sluice/service"
)

// seriesCount counts the series of a metric whose labels contain sub in
// any value.
func seriesCount(t *testing.T, h *harness, name, sub string) int {
	t.Helper()
	families, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.Contains(l.GetValue(), sub) {
					n++
					break
				}
			}
		}
	}
	return n
}

func TestSeriesOfRemovedRulesAreDeleted(t *testing.T) {
	const (
		edge = `
domain: edge
descriptors:
  - key: user_id
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: tenant
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 3}
`
		gone = `
domain: gone
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 3}
`
		after = `
domain: edge
descriptors:
  - key: user_id
    rate_limit: {unit: minute, requests_per_unit: 3}
`
	)
	store := ruleset.NewStore(mustRules(t, edge, gone))
	h := newHarness(t, edge, func(o *service.Options) { o.Rules = store })
	h.call(t, request("edge", desc("user_id=a"), desc("tenant=acme")))
	h.call(t, request("gone", desc("ip=1")))
	for _, sub := range []string{"edge.user_id", "edge.tenant_acme", "gone"} {
		if seriesCount(t, h, "ratelimit_decisions_total", sub)+seriesCount(t, h, "ratelimit_requests_total", sub) == 0 {
			t.Fatalf("no series for %s before the reload", sub)
		}
	}
	store.Swap(mustRules(t, after))
	h.call(t, request("edge", desc("user_id=a")))
	if seriesCount(t, h, "ratelimit_decisions_total", "edge.user_id") == 0 {
		t.Error("series of the kept rule deleted")
	}
	for _, sub := range []string{"edge.tenant", "gone"} {
		if n := seriesCount(t, h, "ratelimit_decisions_total", sub) + seriesCount(t, h, "ratelimit_requests_total", sub); n != 0 {
			t.Errorf("%d series of removed %s left after the reload", n, sub)
		}
	}
}

func TestValueSeriesAreCapped(t *testing.T) {
	const rules = `
domain: edge
descriptors:
  - key: tenant
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 3}
`
	h := newHarness(t, rules, func(o *service.Options) { o.MaxMetricValues = 3 })
	for _, v := range []string{"a", "b", "c", "d", "e", "a"} {
		h.call(t, request("edge", desc("tenant="+v)))
	}
	for _, v := range []string{"a", "b", "c"} {
		if decisionValue(t, h, "edge", "edge.tenant_"+v, "global", "ok") == 0 {
			t.Errorf("no series for tenant %s, within the cap", v)
		}
	}
	if n := seriesCount(t, h, "ratelimit_decisions_total", "tenant_d") + seriesCount(t, h, "ratelimit_decisions_total", "tenant_e"); n != 0 {
		t.Errorf("%d series for values beyond the cap", n)
	}
	if got := decisionValue(t, h, "edge", "edge.tenant:overflow", "global", "ok"); got != 2 {
		t.Errorf("overflow series counted %v, want 2 (d and e)", got)
	}
}

// TestDecisionSeriesOfTypicalRules counts the ratelimit_decisions_total
// series of the embedded example rules once each rule has decided: 3 per
// layer the rule has a limit in (ok, over_limit, near_limit), gray="false"
// only; no fallback layer on the memory backend. A gray request adds the
// one series it counts in. (On main: 24 per rule, 120 here.)
func TestDecisionSeriesOfTypicalRules(t *testing.T) {
	h := newHarness(t, string(ruleset.DefaultRules()))
	for _, d := range [][]string{
		{"remote_address=10.0.0.1"},              // local and global: 6
		{"remote_address=50.0.0.5"},              // global, limit 0: 3
		{"user_id=alice"},                        // global: 3
		{"route=/api/orders/7", "user_id=alice"}, // global: 3
		{"tenant=acme"},                          // local: 3
		{"route=/healthz"},                       // unlimited: none
	} {
		h.call(t, request("edge", desc(d...)))
	}
	const want = 18
	if n := seriesCount(t, h, "ratelimit_decisions_total", "edge"); n != want {
		t.Errorf("%d ratelimit_decisions_total series for the example rules, want %d", n, want)
	}
	for _, sub := range []string{"fallback", "true", "shadow_mode"} {
		if n := seriesCount(t, h, "ratelimit_decisions_total", sub); n != 0 {
			t.Errorf("%d series with %s before any such decision", n, sub)
		}
	}
	h.call(t, request("edge", desc("remote_address=10.0.0.2", "gray=true")))
	if n := seriesCount(t, h, "ratelimit_decisions_total", "true"); n != 1 {
		t.Errorf("%d gray series after one gray request of one rule, want 1", n)
	}
	if got := decisionValue(t, h, "edge", "edge.remote_address", "local", "ok") + decisionValue(t, h, "edge", "edge.remote_address", "global", "ok"); got != 1 {
		t.Errorf("edge.remote_address gray=false ok decisions: %v, want 1", got)
	}
}
