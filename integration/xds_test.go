//go:build integration

package integration

import (
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/sluice-rls/sluice/internal/xdstest"
)

func xdsLimit(rpu uint32) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{
		Name: "edge", Domain: "edge",
		Descriptors: []*rlsconfv3.RateLimitDescriptor{{
			Key:       "user",
			RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: rpu},
		}},
	}
}

// TestXDSManagementServerRestart runs the built binary on rules from a real
// management server, stops the server and starts it again on the same
// port with new rules: the node keeps deciding on the last rules while the
// server is gone, stays ready, reconnects by itself and applies the new
// version.
func TestXDSManagementServerRestart(t *testing.T) {
	t.Parallel()
	mgmt := xdstest.Start(t, "")
	p := startRLS(t, "--xds-server", mgmt.Addr, "--xds-node-id", "envoy-ratelimit", "--xds-backoff-min", "50ms", "--xds-backoff-max", "200ms")
	code := func() rlsv3.RateLimitResponse_Code {
		t.Helper()
		return p.Check(t, "edge", "user=alice").GetOverallCode()
	}
	if status, body := p.HTTPGet(t, "/healthcheck"); status != http.StatusServiceUnavailable {
		t.Errorf("/healthcheck before the first update: %d %q, want 503", status, body)
	}
	if got := code(); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("before the first update: %v, want OK", got)
	}

	mgmt.Set(t, "envoy-ratelimit", "v1", xdsLimit(0))
	mgmt.WaitRequest(t, xdstest.ACK("v1"))
	if got := code(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("on v1: %v, want OVER_LIMIT", got)
	}

	addr := mgmt.Addr
	mgmt.Stop()
	if got := code(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("with the server gone: %v, want v1's OVER_LIMIT", got)
	}
	if status, _ := p.HTTPGet(t, "/healthcheck"); status != http.StatusOK {
		t.Errorf("/healthcheck with the server gone: %d, want 200 (still ready)", status)
	}

	mgmt = xdstest.Start(t, addr)
	mgmt.Set(t, "envoy-ratelimit", "v2", xdsLimit(1000))
	mgmt.WaitRequest(t, xdstest.ACK("v2"))
	if got := code(); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("on v2: %v, want OK", got)
	}
	if _, body := p.HTTPGet(t, "/rlconfig"); !strings.HasPrefix(body, "# version: v2 source: xds\n") {
		t.Errorf("/rlconfig:\n%s\nwant version v2", body)
	}
	if !strings.Contains(p.Log(), "reconnecting") {
		t.Errorf("no reconnect logged:\n%s", p.Log())
	}
	p.Signal(t, syscall.SIGTERM)
	if err := p.Wait(t, 15*time.Second); err != nil {
		t.Errorf("rls exited with %v after SIGTERM", err)
	}
}
