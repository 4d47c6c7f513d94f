package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-rls/sluice/internal/xdstest"
)

// Envoy Gateway's shape: one RateLimitConfig per listener, its domain the
// listener's name, a route descriptor holding one descriptor per rule.
const (
	egDomain = "default/eg/http"
	egRoute  = "httproute/default/backend/rule/0"
)

// TestServeXDSReadinessAsPeer: with envoyproxy/ratelimit's variables, rls
// serve is ready before the first xDS update exactly when the peer is:
// FORCE_START_WITHOUT_INITIAL_CONFIG=true (Envoy Gateway's), unless
// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true. Either way it answers OK
// until the first update, and the log says which.
func TestServeXDSReadinessAsPeer(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		ready   bool
		logLine string
	}{
		{"force start", map[string]string{"FORCE_START_WITHOUT_INITIAL_CONFIG": "true"}, true, `"flag":"--xds-ready-before-rules","value":"\"true\""`},
		{"force start, healthy with rules loaded", map[string]string{"FORCE_START_WITHOUT_INITIAL_CONFIG": "true", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "true"}, false, `"flag":"--xds-ready-before-rules","value":"\"false\""`},
		{"no force start", map[string]string{"FORCE_START_WITHOUT_INITIAL_CONFIG": "false"}, false, `"flag":"--xds-ready-before-rules","value":"\"false\""`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mgmt := xdstest.Start(t, "")
			env := map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": mgmt.Addr, "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit"}
			for k, v := range tt.env {
				env[k] = v
			}
			srv := serveInProcess(t, func(k string) string { return env[k] }, loopback("--log-format", "json")...)
			start := srv.Serving()
			conn, err := grpc.NewClient(start["grpc_addr"].(string), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			wantHTTP, wantGRPC := http.StatusServiceUnavailable, healthpb.HealthCheckResponse_NOT_SERVING
			if tt.ready {
				wantHTTP, wantGRPC = http.StatusOK, healthpb.HealthCheckResponse_SERVING
			}
			if code, body := httpGet(t, "http://"+start["http_addr"].(string)+"/healthcheck"); code != wantHTTP {
				t.Errorf("/healthcheck before the first update: %d %q, want %d", code, body, wantHTTP)
			}
			resp, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: "ratelimit"})
			if err != nil || resp.GetStatus() != wantGRPC {
				t.Errorf("gRPC health before the first update: %v, %v; want %v", resp.GetStatus(), err, wantGRPC)
			}
			decision, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: egDomain,
				Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: egRoute, Value: egRoute}}}}})
			if err != nil || decision.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				t.Errorf("decision before the first update: %v, %v; want OK", decision.GetOverallCode(), err)
			}
			if !strings.Contains(srv.Log.String(), tt.logLine) {
				t.Errorf("log lacks %s:\n%s", tt.logLine, srv.Log.String())
			}
			srv.StopCleanly()
		})
	}
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}
