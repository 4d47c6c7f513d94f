package service_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rls/sluice/service"
)

// malformedRules limit per address, per user and per path prefix.
const malformedRules = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: user_id
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 1}
`

func TestLongValueIsLimitedByItsDigest(t *testing.T) {
	h := newHarness(t, malformedRules, func(o *service.Options) { o.MaxValueBytes = 16 })
	long := strings.Repeat("u", 1100)
	// The long value must not free the request from the address rule...
	req := request("edge", desc("remote_address=1.2.3.4"), desc("user_id="+long))
	if got := h.admitted(t, 4, req); got != 2 {
		t.Errorf("admitted %d of 4 requests with a long user_id, want 2 (the address limit)", got)
	}
	// ...nor from its own rule: one bucket per long value.
	h2 := newHarness(t, malformedRules, func(o *service.Options) { o.MaxValueBytes = 16 })
	if got := h2.admitted(t, 5, request("edge", desc("user_id="+long))); got != 3 {
		t.Errorf("admitted %d of 5 with one long user_id, want 3", got)
	}
	if got := h2.admitted(t, 5, request("edge", desc("user_id="+long+"x"))); got != 3 {
		t.Errorf("admitted %d of 5 with another long user_id, want 3 (a bucket of its own)", got)
	}
	// A long value still matches a prefix rule by its full text.
	if got := h2.admitted(t, 3, request("edge", desc("path=/api/"+long))); got != 1 {
		t.Errorf("admitted %d of 3 long /api/ paths, want 1", got)
	}
	if got := metricValue(t, h2, "ratelimit_malformed_parts_total", map[string]string{"kind": "long_value"}); got != 13 {
		t.Errorf("long_value count = %v, want 13", got)
	}
}

func TestLongValueLogAndMetricLabelsAreBounded(t *testing.T) {
	var buf strings.Builder
	const rules = `
domain: edge
descriptors:
  - key: user_id
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 0}
`
	h := newHarness(t, rules, func(o *service.Options) {
		o.MaxValueBytes = 16
		o.RefusalLogEvery = 1
		o.Logger = slog.New(slog.NewTextHandler(&buf, nil))
	})
	long := strings.Repeat("v", 1100)
	if got := h.call(t, request("edge", desc("user_id="+long))).GetOverallCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("code %v, want OVER_LIMIT", got)
	}
	if strings.Contains(buf.String(), long[:100]) || !strings.Contains(buf.String(), "user_id=sha256:") {
		t.Errorf("refusal log does not show the digest instead of the value:\n%.300s", buf.String())
	}
	families, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if len(l.GetValue()) > 200 {
					t.Errorf("%s has a %d-byte label value", f.GetName(), len(l.GetValue()))
				}
			}
		}
	}
}

func TestBadOverrideLeavesTheRuleDeciding(t *testing.T) {
	h := newHarness(t, malformedRules)
	admitted := 0
	for _, o := range []*commonv3.RateLimitDescriptor_RateLimitOverride{
		{RequestsPerUnit: 1000},                                 // no unit
		{RequestsPerUnit: 1000, Unit: typev3.RateLimitUnit(99)}, // unknown unit
		{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_DAY, UnitMultiplier: wrapperspb.UInt32(616_385_997)},
		{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_YEAR, UnitMultiplier: wrapperspb.UInt32(293)},
	} {
		d := desc("remote_address=5.6.7.8")
		d.Limit = o
		admitted += h.admitted(t, 1, request("edge", d, desc("user_id=amy")))
	}
	// Four requests went to the address rule (2/minute), not to their
	// overrides: it admitted two and refused two.
	if admitted != 2 {
		t.Errorf("admitted %d of 4, want 2 (the address rule)", admitted)
	}
	if got := decisionValue(t, h, "edge", "edge.remote_address", "global", "over_limit"); got != 2 {
		t.Errorf("address rule refused %v, want 2", got)
	}
	if got := metricValue(t, h, "ratelimit_malformed_parts_total", map[string]string{"kind": "bad_override"}); got != 4 {
		t.Errorf("bad_override count = %v, want 4", got)
	}
}

func TestCostAboveBurstIsNeverRetryable(t *testing.T) {
	h := newHarness(t, malformedRules)
	d := desc("user_id=bob")
	d.HitsAddend = wrapperspb.UInt64(20)
	resp, err := h.srv.ShouldRateLimit(context.Background(), request("edge", d))
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("cost 20 on burst 3: %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	for _, k := range []string{"retry-after", "x-ratelimit-retry-after-ms"} {
		if v := headerValue(resp, k); v != "" {
			t.Errorf("%s: %q for a request that can never pass, want no header", k, v)
		}
	}
	body := string(resp.GetRawBody())
	if strings.Contains(body, "retry_after_ms") || !strings.Contains(body, `"remaining":3`) {
		t.Errorf("body %s: want no retry_after_ms and remaining 3 (as the status)", body)
	}
	if got := resp.GetStatuses()[0].GetLimitRemaining(); got != 3 {
		t.Errorf("status remaining %d, want 3", got)
	}
}

func TestRefusalBodyRemainingMatchesStatus(t *testing.T) {
	h := newHarness(t, malformedRules)
	d := desc("user_id=cy")
	d.HitsAddend = wrapperspb.UInt64(2)
	h.call(t, request("edge", d)) // 1 left
	resp := h.call(t, request("edge", d))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second cost-2 request: %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	if body := string(resp.GetRawBody()); !strings.Contains(body, `"remaining":1`) {
		t.Errorf("body %s, want remaining 1 as the status says (%d)", body, resp.GetStatuses()[0].GetLimitRemaining())
	}
	if headerValue(resp, "x-ratelimit-retry-after-ms") == "" {
		t.Error("no retry header on a refusal that a wait cures")
	}
}
