package node

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-rls/sluice/emergency"
)

// TestServeEmergencyChannel: Emergency's key and secret file reach the
// service: on the embedded rules, the blocklisted 50.0.0.5 is let
// through with the secret, logged with the rule it bypassed and without
// the secret, and refused with a wrong one.
func TestServeEmergencyChannel(t *testing.T) {
	const secret = "break-glass-5a1b"
	path := filepath.Join(t.TempDir(), "digests")
	if err := os.WriteFile(path, []byte("# on-call, 2026-12\n"+emergency.Digest(secret)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := testOptions()
	opts.Emergency = Emergency{Key: "emergency", SecretFile: path}
	srv := start(t, opts)
	client := srv.Client()
	call := func(value string) rlsv3.RateLimitResponse_Code {
		t.Helper()
		resp, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{
			{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "50.0.0.5"}}},
			{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "emergency", Value: value}}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode()
	}
	if got := call(secret); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("blocklisted address with the secret: %v, want OK", got)
	}
	if got := call("not-" + secret); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("blocklisted address with a wrong secret: %v, want OVER_LIMIT", got)
	}
	if err := srv.Stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	logs := srv.Log.String()
	for _, want := range []string{`"msg":"emergency channel on"`, `"secrets":1`, `"bypassed_rules":["edge.remote_address_50.0.0.5"]`} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %s:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, secret) || strings.Contains(logs, emergency.Digest(secret)[:16]) {
		t.Errorf("logs hold the secret or its digest:\n%s", logs)
	}
}

// TestServeEmergencyBadFile: a secrets file that does not parse stops the
// node at start, naming the line and not repeating it.
func TestServeEmergencyBadFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "digests")
	if err := os.WriteFile(path, []byte("plain-secret-by-mistake\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts := testOptions()
	opts.Emergency = Emergency{Key: "emergency", SecretFile: path}
	err := runErr(t, opts)
	if err == nil || !strings.Contains(err.Error(), "line 1: not a SHA-256 digest") || strings.Contains(err.Error(), "plain-secret") {
		t.Errorf("a node with a bad secrets file: %v, want an error naming line 1 without its content", err)
	}
}
