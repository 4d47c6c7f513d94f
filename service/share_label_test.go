package service_test

import (
	"strings"
	"testing"
)

// decisionRules returns the distinct rule labels of domain's
// ratelimit_decisions_total series in the harness registry.
func decisionRules(t *testing.T, h *harness, domain string) map[string]bool {
	t.Helper()
	families, err := h.reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	rules := map[string]bool{}
	for _, f := range families {
		if f.GetName() != "ratelimit_decisions_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			var dom, rule string
			for _, lp := range m.GetLabel() {
				switch lp.GetName() {
				case "domain":
					dom = lp.GetValue()
				case "rule":
					rule = lp.GetValue()
				}
			}
			if dom == domain {
				rules[rule] = true
			}
		}
	}
	return rules
}

// With share_threshold every value matching the wildcard shares one bucket,
// so the metric label names the wildcard pattern even when value_to_metric
// is set: distinct request values must not become distinct series.
func TestShareThresholdValueToMetricLabelsThePattern(t *testing.T) {
	h := newHarness(t, `
domain: share
descriptors:
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 2}
`)
	values := []string{"api/a", "api/b", "api/c"}
	total := 0
	for _, v := range values {
		total += h.admitted(t, 2, request("share", desc("route="+v)))
	}
	if total != 2 {
		t.Errorf("three values admitted %d of 6, want 2 (one shared bucket)", total)
	}
	rules := decisionRules(t, h, "share")
	if len(rules) != 1 || !rules["share.route_api/*"] {
		t.Fatalf("rule labels = %v, want only share.route_api/*", rules)
	}
	ok := decisionValue(t, h, "share", "share.route_api/*", "global", "ok") +
		decisionValue(t, h, "share", "share.route_api/*", "global", "near_limit")
	if ok != 2 {
		t.Errorf("ok+near_limit for share.route_api/* = %v, want 2", ok)
	}
	if over := decisionValue(t, h, "share", "share.route_api/*", "global", "over_limit"); over != 4 {
		t.Errorf("over_limit for share.route_api/* = %v, want 4", over)
	}

	// More distinct values do not add series.
	before := allSeries(t, h)
	for i := 0; i < 20; i++ {
		h.admitted(t, 1, request("share", desc("route=api/x"+strings.Repeat("y", i))))
	}
	if after := allSeries(t, h); after != before {
		t.Errorf("series grew from %d to %d with 20 more distinct values", before, after)
	}
}

// Without share_threshold value_to_metric still labels the request value.
func TestValueToMetricWildcardWithoutShareLabelsTheValue(t *testing.T) {
	h := newHarness(t, `
domain: own
descriptors:
  - key: route
    value: api/*
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`)
	for _, v := range []string{"api/a", "api/b"} {
		h.admitted(t, 2, request("own", desc("route="+v)))
	}
	rules := decisionRules(t, h, "own")
	if len(rules) != 2 || !rules["own.route_api/a"] || !rules["own.route_api/b"] {
		t.Fatalf("rule labels = %v, want own.route_api/a and own.route_api/b", rules)
	}
}

// allSeries counts every series the harness registry holds.
func allSeries(t *testing.T, h *harness) int {
	t.Helper()
	families, err := h.reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	n := 0
	for _, f := range families {
		n += len(f.GetMetric())
	}
	return n
}
