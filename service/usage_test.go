package service_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"

	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/service"
)

// usageRules has a rule with both layers, a local-only one, a global-only
// one with a name, an unlimited one and a share_threshold one.
const usageRules = `
domain: edge
descriptors:
  - key: user_id
    rate_limit:
      unit: minute
      requests_per_unit: 60
      burst: 10
      local: {unit: second, requests_per_unit: 2, burst: 4}
  - key: tenant
    rate_limit:
      local: {unit: second, requests_per_unit: 5, burst: 5}
  - key: api_key
    rate_limit: {name: per_key, unit: hour, requests_per_unit: 100}
  - key: route
    value: /healthz
    rate_limit: {unlimited: true}
  - key: team
    value: "a*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 6}
  - key: plan
    value: gold
    descriptors:
      - key: api_key
        rate_limit: {unit: hour, requests_per_unit: 1000, replaces: [{name: per_key}]}
`

// usageServer serves h's /usage and /usage/top on loopback.
func usageServer(t *testing.T, h *harness) string {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/usage", h.srv.UsageHandler())
	mux.Handle("/usage/top", h.srv.TopRefusedHandler())
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	return ts.URL
}

// getUsage asks /usage for descriptors of domain and decodes the answer.
func getUsage(t *testing.T, base, domain string, descs ...string) service.Usage {
	t.Helper()
	code, body := get(t, base+"/usage?"+usageQuery(domain, descs...))
	if code != http.StatusOK {
		t.Fatalf("GET /usage %s %v: %d %s", domain, descs, code, body)
	}
	var u service.Usage
	if err := json.Unmarshal([]byte(body), &u); err != nil {
		t.Fatalf("decode /usage answer %s: %v", body, err)
	}
	return u
}

func usageQuery(domain string, descs ...string) string {
	q := url.Values{"domain": {domain}}
	for _, d := range descs {
		q.Add("descriptor", d)
	}
	return q.Encode()
}

func get(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestUsageAfterTakesOverGRPC takes tokens over a real gRPC connection,
// then reads them on /usage: both layers' remaining tokens and time to
// full, the same on a second reading, and the next take finds exactly
// the tokens /usage reported (it took none).
func TestUsageAfterTakesOverGRPC(t *testing.T) {
	h := newHarness(t, usageRules)
	c := rlsClient(t, h)
	base := usageServer(t, h)
	for range 3 {
		if resp := rpc(t, c, request("edge", desc("user_id=alice"))); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("take: %v", resp)
		}
	}
	want := service.Usage{Domain: "edge", Descriptors: []service.UsageDescriptor{{
		Descriptor: "user_id=alice",
		Rule:       &service.UsageRule{Path: "edge.user_id"},
		Layers: []service.UsageLayer{
			// 2/s, burst 4: 3 taken, 1 left, 1.5 s to refill 3.
			{Layer: "local", Source: "memory (this node)", Limit: service.UsageLimit{RequestsPerUnit: 2, Unit: "second", Burst: 4},
				Remaining: 1, FullIn: "1.5s", FullInMS: 1500},
			// 60/min, burst 10: 7 left, 3 s to refill 3.
			{Layer: "global", Source: "redis (the fleet)", Limit: service.UsageLimit{RequestsPerUnit: 60, Unit: "minute", Burst: 10},
				Remaining: 7, FullIn: "3s", FullInMS: 3000},
		},
	}}}
	for i := range 2 {
		if diff := cmp.Diff(want, getUsage(t, base, "edge", "user_id=alice")); diff != "" {
			t.Fatalf("reading %d of /usage (-want +got):\n%s", i+1, diff)
		}
	}
	// The next take finds what /usage said: one local token, seven global.
	resp := rpc(t, c, request("edge", desc("user_id=alice")))
	if got := resp.GetStatuses()[0].GetLimitRemaining(); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || got != 0 {
		t.Fatalf("take after /usage: %v remaining %d, want OK remaining 0 (local)", resp.GetOverallCode(), got)
	}
	u := getUsage(t, base, "edge", "user_id=alice")
	if got := []uint64{u.Descriptors[0].Layers[0].Remaining, u.Descriptors[0].Layers[1].Remaining}; !slicesEqual(got, []uint64{0, 6}) {
		t.Fatalf("after the fourth take: remaining %v, want [0 6]", got)
	}
	// Time refills on the injected clock.
	h.clock.Advance(time.Second)
	u = getUsage(t, base, "edge", "user_id=alice")
	if l := u.Descriptors[0].Layers[0]; l.Remaining != 2 || l.FullIn != "1s" {
		t.Fatalf("a second later: local %+v, want remaining 2, full in 1s", l)
	}
}

func slicesEqual(a, b []uint64) bool { return cmp.Equal(a, b) }

// TestUsageBetweenTakesChangesNothing: a /usage call between two takes
// leaves the count as if it had not happened, on an empty bucket too (a
// check of an empty bucket is refused, and must not refuse or take
// anything else).
func TestUsageBetweenTakesChangesNothing(t *testing.T) {
	h := newHarness(t, usageRules)
	base := usageServer(t, h)
	req := request("edge", desc("api_key=k1"))
	for i := range 100 {
		resp := h.call(t, req)
		if got, want := resp.GetStatuses()[0].GetLimitRemaining(), uint32(99-i); got != want {
			t.Fatalf("take %d: remaining %d, want %d", i+1, got, want)
		}
		u := getUsage(t, base, "edge", "api_key=k1", "user_id=bob")
		if got, want := u.Descriptors[0].Layers[0].Remaining, uint64(99-i); got != want {
			t.Fatalf("/usage after take %d: remaining %d, want %d", i+1, got, want)
		}
	}
	if got := h.call(t, req).GetOverallCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("take 101: %v, want OVER_LIMIT", got)
	}
	// bob's buckets were only read, a hundred times: still full.
	u := getUsage(t, base, "edge", "user_id=bob")
	if l := u.Descriptors[0].Layers; l[0].Remaining != 4 || l[1].Remaining != 10 || l[0].FullInMS != 0 || l[1].FullInMS != 0 {
		t.Fatalf("bob after 100 readings: %+v, want full buckets (4 and 10, full in 0)", l)
	}
	if n := h.local.Len() + h.global.(sharedMemory).Len(); n != 1 {
		t.Fatalf("the layers hold %d buckets, want 1 (api_key's): readings store none", n)
	}
}

// TestUsageKeysAsDecisions: /usage reads the buckets decisions use, for
// gray requests (the gray local bucket, doubled), share_threshold values
// (one bucket for all), long values (their digest), replaced, unlimited
// and local-only rules.
func TestUsageKeysAsDecisions(t *testing.T) {
	h := newHarness(t, usageRules)
	base := usageServer(t, h)
	long := strings.Repeat("x", service.DefaultMaxValueBytes+1)

	h.call(t, request("edge", desc("user_id=carol", "gray=true")))
	h.call(t, request("edge", desc("team=alpha")))
	h.call(t, request("edge", desc("tenant="+long)))

	u := getUsage(t, base, "edge", "user_id=carol,gray=true")
	if !u.Gray {
		t.Errorf("gray request: Gray false")
	}
	if l := u.Descriptors[0].Layers[0]; l.Limit.RequestsPerUnit != 4 || l.Limit.Burst != 8 || l.Remaining != 7 {
		t.Errorf("gray local bucket: %+v, want 4/second, burst 8, remaining 7", l)
	}
	if l := getUsage(t, base, "edge", "user_id=carol").Descriptors[0].Layers[0]; l.Remaining != 4 {
		t.Errorf("non-gray local bucket of carol: remaining %d, want 4 (untouched)", l.Remaining)
	}
	// share_threshold: another value matching a* is in alpha's bucket.
	if l := getUsage(t, base, "edge", "team=andromeda").Descriptors[0].Layers[0]; l.Remaining != 5 {
		t.Errorf("team=andromeda (shares alpha's bucket): remaining %d, want 5", l.Remaining)
	}
	before := metricValue(t, h, "ratelimit_malformed_parts_total", map[string]string{"kind": "long_value"})
	if l := getUsage(t, base, "edge", "tenant="+long).Descriptors[0].Layers; len(l) != 1 || l[0].Layer != "local" || l[0].Remaining != 4 {
		t.Errorf("long tenant value: %+v, want one local layer with 4 left", l)
	}
	if got := metricValue(t, h, "ratelimit_malformed_parts_total", map[string]string{"kind": "long_value"}); got != before+1 {
		t.Errorf("long values counted %v after /usage, want %v (as a decision counts them)", got, before+1)
	}
	d := getUsage(t, base, "edge", "route=/healthz", "nothing=here").Descriptors
	if !d[0].Unlimited || d[0].Rule == nil || len(d[0].Layers) != 0 {
		t.Errorf("unlimited rule: %+v", d[0])
	}
	if d[1].Rule != nil || len(d[1].Layers) != 0 {
		t.Errorf("no rule: %+v", d[1])
	}
	if r := getUsage(t, base, "edge", "api_key=z").Descriptors[0].Rule; r == nil || r.Name != "per_key" {
		t.Errorf("named rule: %+v, want name per_key", r)
	}
	// With plan=gold,api_key=z in the same request, per_key is replaced.
	d = getUsage(t, base, "edge", "api_key=z", "plan=gold,api_key=z").Descriptors
	if d[0].Rule != nil || d[0].Replaced == nil || d[0].Replaced.Name != "per_key" || len(d[0].Layers) != 0 {
		t.Errorf("replaced rule: %+v, want no rule, replaced per_key, no layers", d[0])
	}
	if d[1].Rule == nil || d[1].Rule.Path != "edge.plan_gold.api_key" || d[1].Layers[0].Limit.RequestsPerUnit != 1000 {
		t.Errorf("replacing rule: %+v", d[1])
	}
}

// TestUsageBadInput: what /usage cannot read gets 400 (404 for a domain
// without rules, 405 for POST) and a message saying what is wrong.
func TestUsageBadInput(t *testing.T) {
	h := newHarness(t, usageRules)
	base := usageServer(t, h)
	many := make([]string, service.DefaultMaxDescriptors+1)
	for i := range many {
		many[i] = "user_id=x"
	}
	for _, tc := range []struct {
		name, query string
		code        int
		says        string
	}{
		{"no domain", "descriptor=user_id%3Dx", 400, "missing domain"},
		{"no descriptor", "domain=edge", 400, "missing descriptor"},
		{"no equals sign", usageQuery("edge", "user_id"), 400, "want KEY=VALUE"},
		{"empty key", usageQuery("edge", "=x"), 400, "want KEY=VALUE"},
		{"too many descriptors", usageQuery("edge", many...), 400, "more than the limit of 256"},
		{"unknown domain", usageQuery("nope", "user_id=x"), 404, `domain "nope": no rules for this domain`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := get(t, base+"/usage?"+tc.query)
			if code != tc.code || !strings.Contains(body, tc.says) {
				t.Fatalf("GET /usage?%.60s: %d %q, want %d saying %q", tc.query, code, body, tc.code, tc.says)
			}
		})
	}
	resp, err := http.Post(base+"/usage?"+usageQuery("edge", "user_id=x"), "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST /usage: %d, want 405", resp.StatusCode)
	}
}

// TestUsageLayers: who answers is named: the memory global layer without
// Redis, the fallback, a skipped layer, a failing one.
func TestUsageLayers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		global bucket.Limiter
		want   service.UsageLayer
	}{
		{"fallback", answering{bucket.Fallback, nil}, service.UsageLayer{Layer: "fallback", Remaining: 3, FullIn: "2s", FullInMS: 2000}},
		{"skipped", answering{bucket.Skipped, nil}, service.UsageLayer{Layer: "global", NotEnforced: "the node is in fallback and --redis-failure local skips the global layer"}},
		{"failing", answering{bucket.Decided, errors.New("redis down")}, service.UsageLayer{Layer: "global", Error: "redis down"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, usageRules, func(o *service.Options) { o.Global = tc.global })
			u, err := h.srv.Usage(context.Background(), request("edge", desc("api_key=k")))
			if err != nil {
				t.Fatal(err)
			}
			got := u.Descriptors[0].Layers[0]
			got.Source, got.Limit = "", service.UsageLimit{}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Fatalf("layer (-want +got):\n%s", diff)
			}
		})
	}
	h := newHarness(t, usageRules, func(o *service.Options) { o.Global = nil })
	u, err := h.srv.Usage(context.Background(), request("edge", desc("user_id=a")))
	if err != nil {
		t.Fatal(err)
	}
	if l := u.Descriptors[0].Layers; len(l) != 1 || l[0].Layer != "local" {
		t.Fatalf("without a global layer: %+v, want the local layer only", l)
	}
}

// answering is a global layer that answers every call with answer (and
// 3 tokens, full in 2s) or fails with err. A fake: no local process plays
// a fail-open switch in a chosen state.
type answering struct {
	answer bucket.Answer
	err    error
}

func (a answering) Hit(_ context.Context, hits []bucket.Hit, states []bucket.State) (bucket.Decision, error) {
	if a.err != nil {
		return bucket.Decision{}, a.err
	}
	for i, h := range hits {
		if h.Cost != 0 || !h.Independent || h.Give {
			return bucket.Decision{}, errors.New("not a check-only hit")
		}
		states[i] = bucket.State{Allowed: true, Remaining: 3, ResetAfter: 2 * time.Second}
	}
	return bucket.Decision{Allowed: true, Answer: a.answer}, nil
}

func (answering) Shared() bool { return true }
