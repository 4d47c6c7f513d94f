package main

import (
	"context"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestServeCompatFlags: --quota-mode, --response-metadata,
// --ratelimit-header-limit and --refusal-details=false (here through their
// RLS_* variables) reach the server, on the embedded example rules.
func TestServeCompatFlags(t *testing.T) {
	env := map[string]string{
		"RLS_QUOTA_MODE":             "true",
		"RLS_RESPONSE_METADATA":      "true",
		"RLS_RATELIMIT_HEADERS":      "true",
		"RLS_RATELIMIT_HEADER_LIMIT": "X-Limit",
		"RLS_REFUSAL_DETAILS":        "false",
	}
	srv := serveInProcess(t, func(k string) string { return env[k] }, loopback()...)
	client := srv.Client()
	call := func(pairs ...[2]string) *rlsv3.RateLimitResponse {
		t.Helper()
		req := &rlsv3.RateLimitRequest{Domain: "edge"}
		for _, p := range pairs {
			req.Descriptors = append(req.Descriptors, &commonv3.RateLimitDescriptor{
				Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: p[0], Value: p[1]}},
			})
		}
		resp, err := client.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	header := func(resp *rlsv3.RateLimitResponse, key string) string {
		for _, h := range resp.GetResponseHeadersToAdd() {
			if h.GetKey() == key {
				return h.GetValue()
			}
		}
		return ""
	}

	// 50.0.0.5 is always over its limit; as a quota it refuses the request
	// only with user_id's quota.
	resp := call([2]string{"remote_address", "50.0.0.5"}, [2]string{"user_id", "alice"})
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || resp.GetStatuses()[0].GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("quota mode: %v, statuses %v; want OK with the first OVER_LIMIT", resp.GetOverallCode(), resp.GetStatuses())
	}
	if got := resp.GetDynamicMetadata().GetFields()["domain"].GetStringValue(); got != "edge" {
		t.Errorf("dynamic metadata domain %q, want edge", got)
	}
	if header(resp, "X-Limit") == "" || header(resp, "RateLimit-Limit") != "" {
		t.Errorf("headers %v, want X-Limit and no RateLimit-Limit", resp.GetResponseHeadersToAdd())
	}
	resp = call([2]string{"remote_address", "50.0.0.5"})
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("every quota refused: %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	if header(resp, "retry-after") != "" || header(resp, "x-ratelimit-layer") != "" || len(resp.GetRawBody()) != 0 {
		t.Errorf("--refusal-details=false: headers %v body %q, want neither", resp.GetResponseHeadersToAdd(), resp.GetRawBody())
	}
	if err := srv.Stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
}
