package service_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/jonboulle/clockwork"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rls/sluice/backend/memory"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/service"
)

const twoLayerRules = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 100
      burst: 10
      local: {unit: second, requests_per_unit: 50, burst: 4}
  - key: user_id
    rate_limit: {unit: second, requests_per_unit: 10, burst: 3}
  - key: tenant
    rate_limit:
      local: {unit: second, requests_per_unit: 5}
`

func TestLocalLayerRefusesFirst(t *testing.T) {
	h := newHarness(t, twoLayerRules)
	req := request("edge", desc("remote_address=1.2.3.4"))
	if got := h.admitted(t, 4, req); got != 4 {
		t.Fatalf("admitted %d of the local burst 4", got)
	}
	resp := h.call(t, req)
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("5th request: %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	if got := headerValue(resp, "x-ratelimit-layer"); got != "local" {
		t.Errorf("x-ratelimit-layer = %q, want local", got)
	}
	st := resp.GetStatuses()[0]
	if got := st.GetCurrentLimit().GetRequestsPerUnit(); got != 50 {
		t.Errorf("status describes %d/s, want the local 50/s", got)
	}
	// The global bucket (burst 10) only saw the 4 admitted requests.
	if got := decisionValue(t, h, "edge", "edge.remote_address", "local", "over_limit"); got != 1 {
		t.Errorf("local over_limit decisions = %v, want 1", got)
	}
}

func TestGlobalRefusalGivesLocalTokensBack(t *testing.T) {
	h := newHarness(t, twoLayerRules)
	// user_id has only a global bucket of 3; remote_address has a local one of 4.
	req := request("edge", desc("remote_address=1.2.3.4"), desc("user_id=alice"))
	if got := h.admitted(t, 3, req); got != 3 {
		t.Fatalf("admitted %d of 3", got)
	}
	resp := h.call(t, req)
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || headerValue(resp, "x-ratelimit-layer") != "global" {
		t.Fatalf("4th: %v layer %q, want OVER_LIMIT by global", resp.GetOverallCode(), headerValue(resp, "x-ratelimit-layer"))
	}
	if got := resp.GetStatuses()[0].GetCode(); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("remote_address status = %v, want OK", got)
	}
	if got := resp.GetStatuses()[1].GetCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("user_id status = %v, want OVER_LIMIT", got)
	}
	// Local tokens of the refused request were returned: one left of 4.
	if got := h.admitted(t, 3, request("edge", desc("remote_address=1.2.3.4"))); got != 1 {
		t.Errorf("remote_address alone admitted %d, want 1 (4 local − 3 taken)", got)
	}
}

func TestLocalOnlyRule(t *testing.T) {
	h := newHarness(t, twoLayerRules)
	if got := h.admitted(t, 8, request("edge", desc("tenant=t1"))); got != 5 {
		t.Errorf("local-only admitted %d of 8, want 5", got)
	}
}

func TestGrayDoublesLocalOnly(t *testing.T) {
	h := newHarness(t, twoLayerRules)
	gray := request("edge", desc("remote_address=1.2.3.4", "gray=true"))
	if got := h.admitted(t, 12, gray); got != 8 {
		t.Errorf("gray admitted %d of 12, want 8 (local burst 4 doubled)", got)
	}
	resp := h.call(t, gray)
	if headerValue(resp, "x-ratelimit-gray") != "true" {
		t.Errorf("refused gray request lacks x-ratelimit-gray: %v", resp.GetResponseHeadersToAdd())
	}
	// Gray buckets are separate from normal ones; the global bucket is shared:
	// 10 − 8 = 2 left for normal traffic.
	if got := h.admitted(t, 5, request("edge", desc("remote_address=1.2.3.4"))); got != 2 {
		t.Errorf("normal traffic admitted %d, want 2 (shared global burst 10)", got)
	}
}

// TestEmptyDescriptor: Envoy sends an empty descriptor when a rate_limits
// entry's only action has skip_if_absent and the header is missing. It gets
// OK with no limit; the request's other descriptors are still decided.
func TestEmptyDescriptor(t *testing.T) {
	h := newHarness(t, twoLayerRules)
	h.admitted(t, 3, request("edge", desc("user_id=zed")))
	resp := h.call(t, request("edge", desc(), desc("user_id=zed")))
	if st := resp.GetStatuses()[0]; st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetCurrentLimit() != nil {
		t.Errorf("empty descriptor status = %v, want OK without a limit", st)
	}
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("overall = %v, want OVER_LIMIT from user_id", resp.GetOverallCode())
	}
}

func TestGrayMarkerInOwnDescriptor(t *testing.T) {
	h := newHarness(t, twoLayerRules)
	req := request("edge", desc("gray=true"), desc("remote_address=1.2.3.4"), desc("gray=false"))
	resp := h.call(t, req)
	for i, st := range resp.GetStatuses() {
		if st.GetCode() != rlsv3.RateLimitResponse_OK {
			t.Errorf("status %d = %v, want OK", i, st.GetCode())
		}
	}
	if resp.GetStatuses()[0].GetCurrentLimit() != nil || resp.GetStatuses()[2].GetCurrentLimit() != nil {
		t.Errorf("gray-only descriptors got a limit: %v", resp.GetStatuses())
	}
	if got := resp.GetStatuses()[1].GetCurrentLimit().GetRequestsPerUnit(); got != 100 {
		t.Errorf("remote_address limit %d, want 100 (the doubled local 50/s has fewer tokens left)", got)
	}
}

func TestHitsAddend(t *testing.T) {
	h := newHarness(t, twoLayerRules)
	req := request("edge", desc("user_id=bob"))
	req.HitsAddend = 2
	if got := h.admitted(t, 3, req); got != 1 {
		t.Errorf("cost 2 on burst 3 admitted %d, want 1", got)
	}
	// Per-descriptor 0 checks only: allowed while a token is left, takes none.
	check := request("edge", desc("user_id=bob"))
	check.Descriptors[0].HitsAddend = wrapperspb.UInt64(0)
	for i := range 3 {
		resp := h.call(t, check)
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetLimitRemaining() != 1 {
			t.Fatalf("check %d: %v remaining %d, want OK with 1 left", i, resp.GetOverallCode(), resp.GetStatuses()[0].GetLimitRemaining())
		}
	}
	big := request("edge", desc("user_id=carol"))
	big.Descriptors[0].HitsAddend = wrapperspb.UInt64(4)
	if got := h.call(t, big).GetOverallCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("cost 4 > burst 3: %v, want OVER_LIMIT", got)
	}
}

func TestNegativeHitsGiveBack(t *testing.T) {
	h := newHarness(t, twoLayerRules)
	req := request("edge", desc("user_id=dan"))
	h.admitted(t, 3, req)
	give := request("edge", desc("user_id=dan"))
	give.Descriptors[0].IsNegativeHits = true
	give.Descriptors[0].HitsAddend = wrapperspb.UInt64(10)
	if got := h.call(t, give).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("give-back answered %v", got)
	}
	if got := h.admitted(t, 5, req); got != 3 {
		t.Errorf("after giving back 10, admitted %d, want 3 (never above burst)", got)
	}
}

// TestGivesSurviveLocalRefusal: a request the local layer refuses still
// returns its global gives (is_negative_hits), as a give is never refused
// (bucket.Hit), whichever layer refuses the rest of the request.
func TestGivesSurviveLocalRefusal(t *testing.T) {
	h := newHarness(t, twoLayerRules)
	user := request("edge", desc("user_id=fay"))
	h.admitted(t, 3, user)                                            // the global bucket of 3 is empty
	h.admitted(t, 4, request("edge", desc("remote_address=9.9.9.9"))) // so is the local bucket of 4
	mixed := request("edge", desc("remote_address=9.9.9.9"), desc("user_id=fay"))
	mixed.Descriptors[1].IsNegativeHits = true
	mixed.Descriptors[1].HitsAddend = wrapperspb.UInt64(2)
	resp := h.call(t, mixed)
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || headerValue(resp, "x-ratelimit-layer") != "local" {
		t.Fatalf("mixed request: %v by %q, want OVER_LIMIT by local", resp.GetOverallCode(), headerValue(resp, "x-ratelimit-layer"))
	}
	if got := h.admitted(t, 3, user); got != 2 {
		t.Errorf("after a refused request gave 2 back, user_id admitted %d, want 2", got)
	}
}

func TestEnvoyLimitOverride(t *testing.T) {
	h := newHarness(t, twoLayerRules)
	d := desc("user_id=erin")
	d.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_MINUTE, UnitMultiplier: wrapperspb.UInt32(5)}
	req := request("edge", d)
	if got := h.admitted(t, 4, req); got != 2 {
		t.Errorf("override 2 per 5 minutes admitted %d, want 2", got)
	}
	lim := h.call(t, req).GetStatuses()[0].GetCurrentLimit()
	if lim.GetRequestsPerUnit() != 2 || lim.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || lim.GetUnitMultiplier().GetValue() != 5 {
		t.Errorf("current_limit = %v, want 2 per 5 minutes", lim)
	}
	// The override has its own bucket: the rule's 3 are untouched.
	if got := h.admitted(t, 4, request("edge", desc("user_id=erin"))); got != 3 {
		t.Errorf("without override admitted %d, want 3", got)
	}
	// An override applies to descriptors no rule matches, too.
	o := desc("api_key=k1")
	o.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
	if got := h.admitted(t, 3, request("edge", o)); got != 1 {
		t.Errorf("override on unmatched descriptor admitted %d, want 1", got)
	}
}

func TestOverLimitHeadersAndBody(t *testing.T) {
	h := newHarness(t, twoLayerRules)
	req := request("edge", desc("user_id=frank"))
	h.admitted(t, 3, req)
	resp := h.call(t, req)
	if got := headerValue(resp, "retry-after"); got != "1" {
		t.Errorf("retry-after = %q, want 1 (100ms rounded up)", got)
	}
	if got := headerValue(resp, "x-ratelimit-retry-after-ms"); got != "100" {
		t.Errorf("x-ratelimit-retry-after-ms = %q, want 100", got)
	}
	var body struct {
		Code         int    `json:"code"`
		RetryAfterMS int64  `json:"retry_after_ms"`
		Reset        int64  `json:"reset"`
		Limit        uint64 `json:"limit"`
		Remaining    uint64 `json:"remaining"`
		Layer        string `json:"layer"`
		Message      string `json:"message"`
	}
	if err := json.Unmarshal(resp.GetRawBody(), &body); err != nil {
		t.Fatalf("raw_body %q: %v", resp.GetRawBody(), err)
	}
	if body.Code != 429 || body.RetryAfterMS != 100 || body.Reset != 1 || body.Limit != 10 || body.Layer != "global" || body.Message == "" {
		t.Errorf("raw_body = %+v", body)
	}
	st := resp.GetStatuses()[0]
	if st.GetLimitRemaining() != 0 || st.GetDurationUntilReset().AsDuration() != 300*time.Millisecond {
		t.Errorf("status remaining %d reset %v, want 0 and 300ms", st.GetLimitRemaining(), st.GetDurationUntilReset().AsDuration())
	}
}

func TestDraftHeaders(t *testing.T) {
	h := newHarness(t, twoLayerRules, func(o *service.Options) { o.RateLimitHeaders = true })
	resp := h.call(t, request("edge", desc("user_id=gina")))
	for k, want := range map[string]string{"RateLimit-Limit": "10", "RateLimit-Remaining": "2", "RateLimit-Reset": "1"} {
		if got := headerValue(resp, k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
}

func TestGlobalShadow(t *testing.T) {
	h := newHarness(t, twoLayerRules, func(o *service.Options) { o.Shadow = true })
	if got := h.admitted(t, 10, request("edge", desc("user_id=hal"))); got != 10 {
		t.Errorf("global shadow admitted %d of 10", got)
	}
	if got := decisionValue(t, h, "edge", "edge.user_id", "global", "shadow_mode"); got != 7 {
		t.Errorf("shadow_mode decisions = %v, want 7", got)
	}
}

func TestUnknownDomain(t *testing.T) {
	h := newHarness(t, twoLayerRules)
	resp := h.call(t, request("nope", desc("user_id=x"), desc("a=b")))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Errorf("unknown domain: %v", resp.GetOverallCode())
	}
	if got := metricValue(t, h, "ratelimit_unknown_domain_requests_total", nil); got != 1 {
		t.Errorf("unknown domain counter = %v", got)
	}
	// Counted there alone (docs/migrating-from-envoy-ratelimit.md adds it
	// to ratelimit_requests_total for the peer's total_requests).
	if got := metricValue(t, h, "ratelimit_requests_total", nil); got != 0 {
		t.Errorf("ratelimit_requests_total = %v after an unknown domain, want 0", got)
	}
}

func TestInvalidRequests(t *testing.T) {
	h := newHarness(t, twoLayerRules, func(o *service.Options) {
		o.MaxDescriptors, o.MaxEntries, o.MaxValueBytes = 3, 2, 16
	})
	tests := []struct {
		name string
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{"empty domain", request("", desc("a=b")), "rate limit domain must not be empty"},
		{"too many descriptors", request("edge", desc("a=1"), desc("a=2"), desc("a=3"), desc("a=4")), "4 descriptors"},
		{"too many entries", request("edge", desc("a=1", "b=2", "c=3")), "3 entries"},
		{"empty key", request("edge", desc("=v")), "empty key"},
		{"no descriptors", request("edge"), "rate limit descriptor list must not be empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := h.srv.ShouldRateLimit(context.Background(), tt.req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want InvalidArgument containing %q", err, tt.want)
			}
		})
	}
	// Counted there alone (docs/migrating-from-envoy-ratelimit.md adds it
	// to ratelimit_requests_total for the peer's total_requests).
	if got := metricValue(t, h, "ratelimit_invalid_requests_total", nil); got != float64(len(tests)) {
		t.Errorf("ratelimit_invalid_requests_total = %v, want %d", got, len(tests))
	}
	if got := metricValue(t, h, "ratelimit_requests_total", nil); got != 0 {
		t.Errorf("ratelimit_requests_total = %v after invalid requests, want 0", got)
	}
	// The server keeps answering.
	if got := h.call(t, request("edge", desc("a=b"))).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("after bad requests: %v", got)
	}
}

func TestRefusalsLoggedSampled(t *testing.T) {
	var buf strings.Builder
	h := newHarness(t, twoLayerRules, func(o *service.Options) {
		o.RefusalLogEvery = 2
		o.Logger = slog.New(slog.NewTextHandler(&buf, nil))
	})
	req := request("edge", desc("user_id=ivan"))
	h.admitted(t, 3+4, req) // 3 admitted, 4 refused
	log := buf.String()
	if n := strings.Count(log, "request over limit"); n != 2 {
		t.Errorf("%d refusal lines for 4 refusals sampled 1 in 2, want 2:\n%s", n, log)
	}
	if !strings.Contains(log, "rule=edge.user_id") || !strings.Contains(log, `descriptor="user_id=ivan"`) || !strings.Contains(log, "layer=global") {
		t.Errorf("refusal line lacks rule, values or layer:\n%s", log)
	}
}

// TestSharedBackendGetsSharedKeys: two nodes (two Servers, each with its
// own node-local hash seeds) on one global backend share its buckets when
// the backend says its buckets are shared, as Redis does; a backend that
// keeps its buckets to itself gets node-local keys. The backend decides,
// not a flag kept in step by hand.
func TestSharedBackendGetsSharedKeys(t *testing.T) {
	for _, tt := range []struct {
		name   string
		global func(*memory.Limiter) bucket.Limiter
		want   int // admitted of 6 over both nodes; user_id's burst is 3
	}{
		{"shared", func(m *memory.Limiter) bucket.Limiter { return sharedMemory{m} }, 3},
		{"node-local", func(m *memory.Limiter) bucket.Limiter { return m }, 6},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clock := clockwork.NewFakeClockAt(harnessStart)
			global := tt.global(memory.New(memory.Options{Clock: clock}))
			node := func() *harness {
				return newHarnessOn(t, clock, twoLayerRules, func(o *service.Options) { o.Global = global })
			}
			a, b := node(), node()
			req := request("edge", desc("user_id=gil"))
			if got := a.admitted(t, 3, req) + b.admitted(t, 3, req); got != tt.want {
				t.Errorf("two nodes admitted %d, want %d", got, tt.want)
			}
		})
	}
}

// TestGrayKeyEmptyTurnsMarkerOff: with GrayKey empty (rls serve --gray-key
// "") a descriptor key "gray" is an ordinary key, matched by rules, and
// marks nothing; with the default it is stripped as the marker.
func TestGrayKeyEmptyTurnsMarkerOff(t *testing.T) {
	const rules = `
domain: edge
descriptors:
  - key: gray
    rate_limit: {unit: hour, requests_per_unit: 1}
`
	req := request("edge", desc("gray=true"))
	off := newHarness(t, rules, func(o *service.Options) { o.GrayKey = "" })
	if got := off.admitted(t, 3, req); got != 1 {
		t.Errorf("gray key off: admitted %d of 3, want 1 (the rule on key gray applies)", got)
	}
	if got := headerValue(off.call(t, req), "x-ratelimit-gray"); got != "" {
		t.Errorf("gray key off: x-ratelimit-gray %q, want none", got)
	}
	on := newHarness(t, rules)
	if got := on.admitted(t, 3, req); got != 3 {
		t.Errorf("default gray key: admitted %d of 3, want 3 (the marker is stripped: no rule)", got)
	}
}
