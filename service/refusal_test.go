package service_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/wrapperspb"

	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/internal/redistest"
	"github.com/sluice-rls/sluice/service"
)

const refusalRules = `
domain: another
descriptors:
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 10}
`

// TestRefusalStatusesAndHeaders: in a refused request, every descriptor's
// status tells its bucket (the untouched one: its limit, its whole tokens,
// its time until full), and the draft-03 headers name the limit that
// refused, with a reset that is not 0.
func TestRefusalStatusesAndHeaders(t *testing.T) {
	h := newHarness(t, refusalRules, func(o *service.Options) { o.RateLimitHeaders = true })
	for range 10 {
		h.call(t, request("another", desc("key3=X")))
	}
	resp := h.call(t, request("another", desc("key2=X"), desc("key3=X")))
	if got := codesOf(resp); got != "OVER_LIMIT: OK OVER_LIMIT" {
		t.Fatalf("codes %s, want OVER_LIMIT: OK OVER_LIMIT", got)
	}
	st := resp.GetStatuses()[0]
	if st.GetCurrentLimit().GetRequestsPerUnit() != 20 || st.GetLimitRemaining() != 20 || st.GetDurationUntilReset().AsDuration() != 0 {
		t.Errorf("key2 status %v, want limit 20, remaining 20, reset 0 (untouched)", st)
	}
	for k, want := range map[string]string{"RateLimit-Limit": "10", "RateLimit-Remaining": "0", "RateLimit-Reset": "3600"} {
		if got := headerValue(resp, k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if b := string(resp.GetRawBody()); !strings.Contains(b, `"limit":10,`) {
		t.Errorf("body %s, want limit 10", b)
	}
}

// TestRefusalHeadersNameTheRefusedLimit: the headers describe the refused
// descriptor even when another one has fewer tokens left (a refusal for a
// cost above what is left).
func TestRefusalHeadersNameTheRefusedLimit(t *testing.T) {
	h := newHarness(t, refusalRules, func(o *service.Options) { o.RateLimitHeaders = true })
	for range 8 {
		h.call(t, request("another", desc("key3=Y")))
	}
	k2 := desc("key2=Y")
	k2.HitsAddend = wrapperspb.UInt64(19)
	h.call(t, request("another", k2))
	k3 := desc("key3=Y")
	k3.HitsAddend = wrapperspb.UInt64(5)
	resp := h.call(t, request("another", desc("key2=Y"), k3))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("%v, want OVER_LIMIT", resp.GetOverallCode())
	}
	if got := resp.GetStatuses()[0].GetLimitRemaining(); got != 1 {
		t.Errorf("key2 remaining %d, want 1", got)
	}
	for k, want := range map[string]string{"RateLimit-Limit": "10", "RateLimit-Remaining": "2"} {
		if got := headerValue(resp, k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if got := headerValue(resp, "RateLimit-Reset"); got == "" || got == "0" {
		t.Errorf("RateLimit-Reset = %q while refused, want > 0", got)
	}
}

// TestRefusalStatusesAndHeadersRedis is TestRefusalStatusesAndHeaders with
// the global layer in a real Redis, its empty-bucket cache on (rls serve's
// default): the refusal comes from the cache, and key2's status and the
// headers still tell the truth (they used to say key2 had 0 left, reset 0,
// and the headers "limit 20, 0 left, reset 0").
func TestRefusalStatusesAndHeadersRedis(t *testing.T) {
	srv := redistest.Start(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	r := redisbackend.New(redisbackend.Options{Client: c, Timeout: 10 * time.Second})
	t.Cleanup(r.Close)
	h := newHarness(t, refusalRules, func(o *service.Options) {
		o.RateLimitHeaders = true
		o.Global = r
	})
	for i := range 10 {
		if resp := h.call(t, request("another", desc("key3=X"))); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request %d of 10: %v", i+1, resp.GetOverallCode())
		}
	}
	resp := h.call(t, request("another", desc("key2=X"), desc("key3=X")))
	if got := codesOf(resp); got != "OVER_LIMIT: OK OVER_LIMIT" {
		t.Fatalf("codes %s, want OVER_LIMIT: OK OVER_LIMIT", got)
	}
	st := resp.GetStatuses()[0]
	if st.GetCurrentLimit().GetRequestsPerUnit() != 20 || st.GetLimitRemaining() != 20 || st.GetDurationUntilReset().AsDuration() != 0 {
		t.Errorf("key2 status %v, want limit 20, remaining 20, reset 0 (untouched)", st)
	}
	for k, want := range map[string]string{"RateLimit-Limit": "10", "RateLimit-Remaining": "0"} {
		if got := headerValue(resp, k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	// An hour to refill, less the time since the 10th request (generous:
	// a busy machine).
	if got, err := strconv.Atoi(headerValue(resp, "RateLimit-Reset")); err != nil || got > 3600 || got < 3500 {
		t.Errorf("RateLimit-Reset = %q, want 3600 less the seconds the test took", headerValue(resp, "RateLimit-Reset"))
	}
}
