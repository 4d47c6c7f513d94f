package service_test

import (
	"context"
	"net"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rls/sluice/service"
)

// These tests pin the answers envoyproxy/ratelimit gives where Envoy and its
// users see them: quota_mode, global shadow, a limit override on
// a shadow rule, the empty descriptor list, the draft header names, the
// refusal extras and the response's dynamic metadata. Each goes through a
// real gRPC server on loopback, as Envoy does.

// rlsClient serves h's Server over gRPC on a loopback port, with the codec
// rls serve uses, and returns a client of it.
func rlsClient(t *testing.T, h *harness) rlsv3.RateLimitServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.ForceServerCodecV2(h.srv.Codec()))
	rlsv3.RegisterRateLimitServiceServer(s, h.srv)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// rpc sends req and fails the test on an error.
func rpc(t *testing.T, c rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := c.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// codes lists a response's overall code then each status' code, e.g.
// "OK: OK OVER_LIMIT".
func codesOf(resp *rlsv3.RateLimitResponse) string {
	var b strings.Builder
	b.WriteString(resp.GetOverallCode().String())
	b.WriteByte(':')
	for _, st := range resp.GetStatuses() {
		b.WriteByte(' ')
		b.WriteString(st.GetCode().String())
	}
	return b.String()
}

const quotaRules = `
domain: ai
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: pool
    value: a
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: pool
    value: b
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: strict
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// TestQuotaModeRule: a quota_mode rule's refusal shows in its status but
// refuses the request only when every quota of the request refuses, or a
// rule without quota_mode refuses (envoyproxy/ratelimit's quota mode).
func TestQuotaModeRule(t *testing.T) {
	h := newHarness(t, quotaRules)
	c := rlsClient(t, h)
	req := request("ai", desc("user=u"), desc("pool=a"), desc("pool=b"))
	for i, want := range []string{
		"OK: OK OK OK",
		"OK: OK OVER_LIMIT OK",                 // pool a's quota is spent, b still has one
		"OVER_LIMIT: OK OVER_LIMIT OVER_LIMIT", // every quota spent
		"OVER_LIMIT: OK OVER_LIMIT OVER_LIMIT",
	} {
		if got := codesOf(rpc(t, c, req)); got != want {
			t.Errorf("request %d: %s, want %s", i+1, got, want)
		}
	}
	// The two refused requests took nothing from user's 10: 2 taken, so the
	// next take leaves 7.
	if got := rpc(t, c, request("ai", desc("user=u"))).GetStatuses()[0].GetLimitRemaining(); got != 7 {
		t.Errorf("user remaining %d, want 7: a request refused by its quotas must take no tokens", got)
	}
	// A refusal by the quotas is a refusal like any other: retry headers.
	resp := rpc(t, c, req)
	if headerValue(resp, "retry-after") == "" || len(resp.GetRawBody()) == 0 {
		t.Errorf("quota refusal without retry-after or body: %v", resp.GetResponseHeadersToAdd())
	}
	// A rule without quota_mode refuses whatever the quotas say.
	h2 := newHarness(t, quotaRules)
	c2 := rlsClient(t, h2)
	req2 := request("ai", desc("strict=s"), desc("pool=b"))
	if got := codesOf(rpc(t, c2, req2)); got != "OK: OK OK" {
		t.Errorf("first: %s", got)
	}
	if got := codesOf(rpc(t, c2, req2)); got != "OVER_LIMIT: OVER_LIMIT OK" {
		t.Errorf("strict spent: %s, want OVER_LIMIT: OVER_LIMIT OK", got)
	}
}

// TestQuotaModeShadowRule: a quota rule in shadow mode answers OK, so it
// never counts as a refusing quota: the request is allowed and takes its
// other tokens.
func TestQuotaModeShadowRule(t *testing.T) {
	const rules = `
domain: ai
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: pool
    quota_mode: true
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`
	h := newHarness(t, rules)
	c := rlsClient(t, h)
	req := request("ai", desc("user=u"), desc("pool=x"))
	var resp *rlsv3.RateLimitResponse
	for i := range 3 {
		if resp = rpc(t, c, req); codesOf(resp) != "OK: OK OK" {
			t.Errorf("request %d: %s, want OK: OK OK", i+1, codesOf(resp))
		}
	}
	if got := resp.GetStatuses()[0].GetLimitRemaining(); got != 7 {
		t.Errorf("user remaining %d after 3 allowed requests, want 7", got)
	}
}

// TestQuotaModeServerWide: Options.QuotaMode (rls serve --quota-mode, the
// peer's global quota mode) makes every rule a quota; a descriptor no rule
// matches is a quota that is never refused.
func TestQuotaModeServerWide(t *testing.T) {
	h := newHarness(t, twoLayerRules, func(o *service.Options) { o.QuotaMode = true })
	c := rlsClient(t, h)
	// user_id: burst 3; tenant: local 5/s, burst 5.
	req := request("edge", desc("user_id=q"), desc("tenant=t"))
	for i := range 3 {
		if got := codesOf(rpc(t, c, req)); got != "OK: OK OK" {
			t.Fatalf("request %d: %s", i+1, got)
		}
	}
	for range 2 { // tenant's local burst is 5
		if got := codesOf(rpc(t, c, req)); got != "OK: OVER_LIMIT OK" {
			t.Errorf("user_id spent: %s, want OK: OVER_LIMIT OK", got)
		}
	}
	if got := codesOf(rpc(t, c, request("edge", desc("user_id=q"), desc("tenant=t"), desc("nomatch=x")))); got != "OK: OVER_LIMIT OVER_LIMIT OK" {
		t.Errorf("with a descriptor no rule matches: %s, want OK: OVER_LIMIT OVER_LIMIT OK", got)
	}
	if got := codesOf(rpc(t, c, req)); got != "OVER_LIMIT: OVER_LIMIT OVER_LIMIT" {
		t.Errorf("both spent: %s, want OVER_LIMIT", got)
	}
}

// TestOverrideOnShadowRuleIsEnforced: Envoy's limit override replaces the
// rule's limit and is enforced even when the rule is in shadow mode, as
// envoyproxy/ratelimit does.
func TestOverrideOnShadowRuleIsEnforced(t *testing.T) {
	const rules = `
domain: edge
descriptors:
  - key: user
    shadow_mode: true
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 100}
`
	h := newHarness(t, rules)
	c := rlsClient(t, h)
	d := desc("user=o")
	d.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_MINUTE}
	req := request("edge", d)
	if got := codesOf(rpc(t, c, req)); got != "OK: OK" {
		t.Errorf("first: %s", got)
	}
	if got := codesOf(rpc(t, c, req)); got != "OVER_LIMIT: OVER_LIMIT" {
		t.Errorf("override spent on a shadow rule: %s, want OVER_LIMIT: OVER_LIMIT", got)
	}
	// Without the override the rule stays in shadow mode.
	plain := request("edge", desc("user=p"))
	for range 101 {
		if got := codesOf(rpc(t, c, plain)); got != "OK: OK" {
			t.Fatalf("shadow rule: %s, want OK: OK", got)
		}
	}
}

// TestGlobalShadowKeepsStatuses: with Options.Shadow (rls serve --shadow)
// the overall code is OK, each refused descriptor's status still says
// OVER_LIMIT, and the refusal extras (which would reach the client on a
// 200) are left out; the draft headers stay, as the peer's do.
func TestGlobalShadowKeepsStatuses(t *testing.T) {
	h := newHarness(t, twoLayerRules, func(o *service.Options) {
		o.Shadow = true
		o.RateLimitHeaders = true
	})
	c := rlsClient(t, h)
	req := request("edge", desc("user_id=s"), desc("other=x"))
	for range 3 {
		rpc(t, c, req)
	}
	resp := rpc(t, c, req)
	if got := codesOf(resp); got != "OK: OVER_LIMIT OK" {
		t.Errorf("global shadow: %s, want OK: OVER_LIMIT OK", got)
	}
	if headerValue(resp, "retry-after") != "" || headerValue(resp, "x-ratelimit-layer") != "" || len(resp.GetRawBody()) != 0 {
		t.Errorf("refusal extras on an OK answer: %v body %q", resp.GetResponseHeadersToAdd(), resp.GetRawBody())
	}
	if got := headerValue(resp, "RateLimit-Remaining"); got != "0" {
		t.Errorf("RateLimit-Remaining = %q, want 0", got)
	}
	if got := decisionValue(t, h, "edge", "edge.user_id", "global", "shadow_mode"); got != 1 {
		t.Errorf("shadow_mode decisions = %v, want 1", got)
	}
}

// TestEmptyDescriptorListIsInvalid: as envoyproxy/ratelimit, a request
// without descriptors is an error; with nothing to limit, Envoy letting it
// through loses nothing.
func TestEmptyDescriptorListIsInvalid(t *testing.T) {
	h := newHarness(t, twoLayerRules)
	_, err := rlsClient(t, h).ShouldRateLimit(context.Background(), request("edge"))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "rate limit descriptor list must not be empty") {
		t.Errorf("err = %v, want InvalidArgument: rate limit descriptor list must not be empty", err)
	}
}

// TestDraftHeaderNames: the draft-03 headers take the names Options give
// (rls serve --ratelimit-header-limit, -remaining, -reset).
func TestDraftHeaderNames(t *testing.T) {
	h := newHarness(t, twoLayerRules, func(o *service.Options) {
		o.RateLimitHeaders = true
		o.HeaderLimit, o.HeaderRemaining, o.HeaderReset = "A-Limit", "A-Remaining", "A-Reset"
	})
	resp := rpc(t, rlsClient(t, h), request("edge", desc("user_id=n")))
	for k, want := range map[string]string{"A-Limit": "10", "A-Remaining": "2", "A-Reset": "1", "RateLimit-Limit": ""} {
		if got := headerValue(resp, k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
}

// TestNoRefusalDetails: Options.NoRefusalDetails (rls serve
// --refusal-details=false) answers a refusal as envoyproxy/ratelimit does:
// no retry-after, no x-ratelimit-* headers, no body.
func TestNoRefusalDetails(t *testing.T) {
	for _, off := range []bool{false, true} {
		h := newHarness(t, twoLayerRules, func(o *service.Options) { o.NoRefusalDetails = off })
		c := rlsClient(t, h)
		req := request("edge", desc("user_id=r", "gray=true"))
		for range 3 {
			rpc(t, c, req)
		}
		resp := rpc(t, c, req)
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("NoRefusalDetails=%v: %v, want OVER_LIMIT", off, resp.GetOverallCode())
		}
		details := len(resp.GetResponseHeadersToAdd()) > 0 || len(resp.GetRawBody()) > 0
		if details == off {
			t.Errorf("NoRefusalDetails=%v: headers %v body %q", off, resp.GetResponseHeadersToAdd(), resp.GetRawBody())
		}
	}
}

const metadataRules = `
domain: ai
descriptors:
  - key: backend
    value: a
    quota_mode: true
    metadata: {service: a, weight: 1, route: {cluster: a, zone: east}}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: backend
    value: b
    quota_mode: true
    metadata: {service: b, extra: true, route: {cluster: b, pool: pt}}
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: free
    metadata: {free: yes}
    rate_limit: {unlimited: true}
`

// TestResponseMetadata: with Options.ResponseMetadata (rls serve
// --response-metadata, the peer's RESPONSE_DYNAMIC_METADATA) the response
// carries domain, descriptors, hitsAddend and the merged metadata of the
// rules answered OK; without it, no dynamic metadata.
func TestResponseMetadata(t *testing.T) {
	off := newHarness(t, metadataRules)
	if md := rpc(t, rlsClient(t, off), request("ai", desc("backend=a"))).GetDynamicMetadata(); md != nil {
		t.Errorf("dynamic metadata without the option: %v", md)
	}

	h := newHarness(t, metadataRules, func(o *service.Options) { o.ResponseMetadata = true })
	c := rlsClient(t, h)
	over := desc("user=u")
	over.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 42, Unit: typev3.RateLimitUnit_MINUTE}
	over.HitsAddend = wrapperspb.UInt64(1)
	req := request("ai", desc("backend=a"), desc("backend=b"), desc("free=x"), over)
	req.HitsAddend = 1
	first := rpc(t, c, req).GetDynamicMetadata().AsMap()
	descs, _ := first["descriptors"].([]any)
	if len(descs) != 4 {
		t.Fatalf("descriptors = %v, want 4", first["descriptors"])
	}
	limit, _ := descs[3].(map[string]any)["limit"].(string)
	if got := strings.Join(strings.Fields(limit), " "); !strings.Contains(got, "requests_per_unit:42") || !strings.Contains(got, "unit:MINUTE") {
		t.Errorf("override limit = %q, want its text form", limit)
	}
	delete(descs[3].(map[string]any), "limit")
	want := map[string]any{
		"domain":     "ai",
		"hitsAddend": 1.0,
		"descriptors": []any{
			map[string]any{"entries": []any{"backend=a"}},
			map[string]any{"entries": []any{"backend=b"}},
			map[string]any{"entries": []any{"free=x"}},
			map[string]any{"entries": []any{"user=u"}, "hitsAddend": 1.0},
		},
		// Both backends answered OK: a's keys first, b's added where a
		// has none, the route mappings merged. The unlimited rule's
		// metadata is not sent, as the peer's.
		"metadata": map[string]any{
			"service": "a", "weight": 1.0, "extra": true,
			"route": map[string]any{"cluster": "a", "zone": "east", "pool": "pt"},
		},
	}
	if diff := cmp.Diff(want, first); diff != "" {
		t.Errorf("first response's metadata (-want +got):\n%s", diff)
	}
	// Backend a is spent: only b's metadata is sent.
	second := rpc(t, c, request("ai", desc("backend=a"), desc("backend=b"))).GetDynamicMetadata().AsMap()
	wantMeta := map[string]any{"service": "b", "extra": true, "route": map[string]any{"cluster": "b", "pool": "pt"}}
	if diff := cmp.Diff(wantMeta, second["metadata"]); diff != "" {
		t.Errorf("metadata with a spent (-want +got):\n%s", diff)
	}
	// An unknown domain still gets domain and descriptors.
	unknown := rpc(t, c, request("nope", desc("k=v"))).GetDynamicMetadata().AsMap()
	if unknown["domain"] != "nope" || unknown["metadata"] != nil {
		t.Errorf("unknown domain metadata = %v", unknown)
	}
}
