//go:build integration

package integration

import (
	"context"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/sluice-rls/sluice/internal/rawproto"
)

// TestMalformedValuesAreLimited sends what a client controls through Envoy —
// descriptor values — at their worst: too long, and not UTF-8. Each request
// also carries the example rules' blocked address, so an answer other than
// OVER_LIMIT (an error included: Envoy lets it through) is a bypass.
func TestMalformedValuesAreLimited(t *testing.T) {
	t.Parallel()
	p := startRLS(t)
	long := strings.Repeat("x", 1100) // over --max-value-bytes (1024)
	resp, err := p.Client.ShouldRateLimit(context.Background(), request("edge", "remote_address=50.0.0.5", "user_id="+long))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("long user_id: %v, %v; want OVER_LIMIT", resp.GetOverallCode(), err)
	}

	var raw rlsv3.RateLimitResponse
	err = p.Conn.Invoke(context.Background(), rawproto.Method,
		rawproto.Request("edge", [2]string{"remote_address", "50.0.0.5"}, [2]string{"user_id", "\xff\xfe"}), &raw,
		grpc.ForceCodecV2(rawproto.Codec{}))
	if err != nil || raw.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("user_id not UTF-8: %v, %v; want OVER_LIMIT", raw.GetOverallCode(), err)
	}

	_, metrics := p.HTTPGet(t, "/metrics")
	for _, want := range []string{
		`ratelimit_malformed_parts_total{kind="long_value"} 1`,
		`ratelimit_malformed_parts_total{kind="invalid_utf8"} 1`,
		`ratelimit_invalid_requests_total 0`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
