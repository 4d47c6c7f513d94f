package service_test

import (
	"context"
	"encoding/json"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// grayDecisions sums ratelimit_decisions_total over the series of rule and
// result whose gray label is gray; a series without a gray label counts
// for neither value.
func grayDecisions(t *testing.T, h *harness, rule, result, gray string) float64 {
	t.Helper()
	families, err := h.reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	sum := 0.0
	for _, f := range families {
		if f.GetName() != "ratelimit_decisions_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			if g, ok := labels["gray"]; ok && g == gray && labels["rule"] == rule && labels["result"] == result {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// TestGrayLabel: ratelimit_decisions_total tells gray decisions from the
// others by its gray label, on cached rule counters and on value labels
// (detailed_metric) alike.
func TestGrayLabel(t *testing.T) {
	h := newHarness(t, twoLayerRules+`
  - key: plan
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 10, burst: 1}
`)
	// Two addresses, so that neither spends the other's global burst of 10.
	gray := request("edge", desc("remote_address=1.2.3.4"), desc("gray=true"))
	normal := request("edge", desc("remote_address=5.6.7.8"))
	h.admitted(t, 10, gray)  // local gray burst 8: 8 allowed, 2 refused
	h.admitted(t, 5, normal) // local burst 4: 4 allowed, 1 refused
	h.admitted(t, 2, request("edge", desc("plan=gold", "gray=true")))
	for _, c := range []struct {
		rule, result, gray string
		want               float64
	}{
		{"edge.remote_address", "over_limit", "true", 2},
		{"edge.remote_address", "over_limit", "false", 1},
		{"edge.plan_gold", "near_limit", "true", 1}, // its last token
		{"edge.plan_gold", "over_limit", "true", 1},
		{"edge.plan_gold", "over_limit", "false", 0},
	} {
		if got := grayDecisions(t, h, c.rule, c.result, c.gray); got != c.want {
			t.Errorf("decisions{rule=%q,result=%q,gray=%q} = %v, want %v", c.rule, c.result, c.gray, got, c.want)
		}
	}
	ok := grayDecisions(t, h, "edge.remote_address", "ok", "true") + grayDecisions(t, h, "edge.remote_address", "near_limit", "true")
	if ok != 8 {
		t.Errorf("gray allowed decisions of edge.remote_address = %v, want 8", ok)
	}
}

// TestGrayRefusalBody: a gray refusal's JSON body says "gray":true; other
// refusals' bodies have no gray field.
func TestGrayRefusalBody(t *testing.T) {
	h := newHarness(t, twoLayerRules)
	for _, c := range []struct {
		name     string
		marker   []string
		n        int
		wantGray bool
	}{
		{"gray", []string{"gray=true"}, 8, true},
		{"normal", nil, 4, false},
	} {
		req := request("edge", desc(append([]string{"remote_address=" + c.name}, c.marker...)...))
		h.admitted(t, c.n, req)
		resp := h.call(t, req)
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("%s: %v after the local burst, want OVER_LIMIT", c.name, resp.GetOverallCode())
		}
		var body map[string]any
		if err := json.Unmarshal(resp.GetRawBody(), &body); err != nil {
			t.Fatalf("%s: body %q: %v", c.name, resp.GetRawBody(), err)
		}
		g, has := body["gray"]
		if c.wantGray && g != true || !c.wantGray && has {
			t.Errorf("%s: body %s, want gray field %v", c.name, resp.GetRawBody(), c.wantGray)
		}
		if body["layer"] != "local" {
			t.Errorf("%s: body %s, want layer local", c.name, resp.GetRawBody())
		}
	}
}

// TestGraySelfMarkedTriplesLocal pins the figure docs/config.md gives for a
// client that sets the gray marker itself: its gray requests have buckets
// of their own at doubled rate and burst beside the normal ones, so mixing
// both it gets 3× a node's local capacity (4 + 8 of a local burst of 4).
// Only global limits still bound it.
func TestGraySelfMarkedTriplesLocal(t *testing.T) {
	h := newHarness(t, `
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      local: {unit: second, requests_per_unit: 50, burst: 4}
`)
	normal := request("edge", desc("remote_address=9.9.9.9"))
	gray := request("edge", desc("remote_address=9.9.9.9", "gray=true"))
	got := h.admitted(t, 10, normal) + h.admitted(t, 20, gray)
	if got != 12 {
		t.Errorf("one client, normal then self-marked gray: admitted %d, want 12 (3 × the local burst 4)", got)
	}
}

// TestGrayLabelAllocatesNothing: a gray request costs no more allocations
// than any other (1, its response, without -race): the gray label's
// counters are built once per rule, not per request.
func TestGrayLabelAllocatesNothing(t *testing.T) {
	if raceDetector {
		t.Skip("the race detector allocates")
	}
	h := newHarness(t, `
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 4000000000
      local: {unit: second, requests_per_unit: 4000000000}
`)
	ctx := context.Background()
	allocs := func(req *rlsv3.RateLimitRequest) float64 {
		return testing.AllocsPerRun(200, func() {
			if _, err := h.srv.ShouldRateLimit(ctx, req); err != nil {
				t.Fatal(err)
			}
		})
	}
	// Two descriptors each, so that both responses are the same size.
	normal := allocs(request("edge", desc("remote_address=1.2.3.4"), desc("plan=none")))
	gray := allocs(request("edge", desc("remote_address=1.2.3.4"), desc("gray=true")))
	if gray != 1 || normal != 1 {
		t.Errorf("allocations per request: gray %v, normal %v; want 1 each (the response)", gray, normal)
	}
}
