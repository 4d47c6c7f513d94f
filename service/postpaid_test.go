package service_test

import (
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// addend sets d's hits_addend, as Envoy sends a rate limit's hits_addend.
func addend(d *commonv3.RateLimitDescriptor, n uint64) *commonv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

// TestQuotaChargedAfterTheCheck is the flow of Envoy AI Gateway's token
// quotas on a quota_mode rule of 2 a minute: a check of hits_addend 0 at
// request time, the real cost charged when the stream is done. Two
// requests use the quota up; the third is still let through (the quota is
// exhausted, not overdrawn, as envoyproxy/ratelimit, whose count is not
// above the limit), and its charge takes the bucket into debt, which
// refuses the fourth until it refilled.
func TestQuotaChargedAfterTheCheck(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `domain: rl
descriptors:
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
`)
	check := request("rl", addend(desc("service=service_2"), 0))
	charge := request("rl", addend(desc("service=service_2"), 1))
	for i, want := range []rlsv3.RateLimitResponse_Code{
		rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT,
	} {
		if got := h.call(t, check).GetOverallCode(); got != want {
			t.Fatalf("request %d: check %v, want %v", i+1, got, want)
		}
		if want == rlsv3.RateLimitResponse_OK {
			h.call(t, charge)
		}
	}
	// One token of debt: refused for the 30 s it takes to refill.
	h.clock.Advance(29 * time.Second)
	if got := h.call(t, check).GetOverallCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("29 s later: check %v, want OVER_LIMIT (in debt)", got)
	}
	h.clock.Advance(time.Second)
	if got := h.call(t, check).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("30 s later: check %v, want OK (the debt refilled)", got)
	}
}

// TestPostpaidRule: a postpaid rule charges usage past its limit, into
// debt of at most one burst, and its refusal refuses the request, whose
// other rules then keep nothing; a rule that is not postpaid takes nothing
// from a refused request, and its checks pass on an empty bucket.
func TestPostpaidRule(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `domain: ai
descriptors:
  - key: tenant
    postpaid: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 5}
`)
	remaining := func(d *commonv3.RateLimitDescriptor) uint32 {
		t.Helper()
		return h.call(t, request("ai", addend(d, 0))).GetStatuses()[0].GetLimitRemaining()
	}
	if got := h.call(t, request("ai", addend(desc("tenant=a"), 8), desc("plain=p"))).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("8 of 10 and 1 of 5: %v, want OK", got)
	}
	// 5 more than the 2 left: refused, and charged all the same; the
	// plain rule's token goes back.
	resp := h.call(t, request("ai", addend(desc("tenant=a"), 5), desc("plain=p")))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT ||
		resp.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT ||
		resp.GetStatuses()[1].GetCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("a charge past the limit: %v, want OVER_LIMIT by the tenant alone", resp)
	}
	if got := remaining(desc("plain=p")); got != 4 {
		t.Errorf("plain after the refused request: %d left, want 4 (its token given back)", got)
	}
	if got := h.call(t, request("ai", addend(desc("tenant=a"), 0))).GetOverallCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("check of the tenant in debt: %v, want OVER_LIMIT", got)
	}
	// 13 spent of 10: in debt for 3 tokens, 18 s.
	h.clock.Advance(18 * time.Second)
	if got := h.call(t, request("ai", addend(desc("tenant=a"), 0))).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("check of the tenant 18 s later: %v, want OK (the debt refilled)", got)
	}
	// A huge charge: the debt is one burst at most, a minute's refill.
	h.call(t, request("ai", addend(desc("tenant=b"), 1_000_000)))
	h.clock.Advance(59 * time.Second)
	if got := h.call(t, request("ai", addend(desc("tenant=b"), 0))).GetOverallCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("59 s after a charge of a million: %v, want OVER_LIMIT", got)
	}
	h.clock.Advance(time.Second)
	if got := h.call(t, request("ai", addend(desc("tenant=b"), 0))).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("60 s after a charge of a million: %v, want OK (the debt is one burst at most)", got)
	}
	// One charge over two descriptors: each is charged on its own, the
	// one that does not fit too, as envoyproxy/ratelimit counts on all.
	resp = h.call(t, request("ai", addend(desc("tenant=c"), 4), addend(desc("tenant=d"), 11)))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("charges of 4 and 11 (burst 10): %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	if got := remaining(desc("tenant=c")); got != 6 {
		t.Errorf("tenant c after a charge of 4 in a refused request: %d left, want 6", got)
	}
	if got := h.call(t, request("ai", addend(desc("tenant=d"), 0))).GetOverallCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("check of tenant d after a charge of 11: %v, want OVER_LIMIT (in debt)", got)
	}
	// Not postpaid: a take past the limit takes nothing, and an empty
	// bucket passes a check.
	if got := h.call(t, request("ai", addend(desc("plain=p"), 5))).GetOverallCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("5 of plain's 4 left: %v, want OVER_LIMIT", got)
	}
	if got := remaining(desc("plain=p")); got != 4 {
		t.Errorf("plain after a refused take: %d left, want 4", got)
	}
	h.call(t, request("ai", addend(desc("plain=p"), 4)))
	if got := h.call(t, request("ai", addend(desc("plain=p"), 0))).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("check of plain's empty bucket: %v, want OK (empty is not in debt)", got)
	}
}

// TestPostpaidChargedWhenLocalRefuses: a request the local layer refuses
// still charges its global postpaid rules (the usage happened).
func TestPostpaidChargedWhenLocalRefuses(t *testing.T) {
	t.Parallel()
	h := newHarness(t, `domain: ai
descriptors:
  - key: hard
    rate_limit:
      local: {unit: minute, requests_per_unit: 1}
  - key: tenant
    postpaid: true
    rate_limit: {unit: minute, requests_per_unit: 10}
`)
	req := request("ai", desc("hard=h"), addend(desc("tenant=a"), 3))
	if got := h.call(t, req).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first request: %v, want OK", got)
	}
	if got := h.call(t, req).GetOverallCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second request: %v, want OVER_LIMIT by the local rule", got)
	}
	st := h.call(t, request("ai", addend(desc("tenant=a"), 0))).GetStatuses()[0]
	if st.GetLimitRemaining() != 4 {
		t.Errorf("tenant after two charges of 3: %d left, want 4", st.GetLimitRemaining())
	}
}
