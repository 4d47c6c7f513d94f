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
