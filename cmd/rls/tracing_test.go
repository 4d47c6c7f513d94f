package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/sluice-rls/sluice/internal/logtest"
	"github.com/sluice-rls/sluice/internal/otlptest"
	"github.com/sluice-rls/sluice/service"
)

// TestServeTracing runs `rls serve` with and without --tracing-endpoint,
// sends one call in a trace Envoy sampled, and stops the server: with
// tracing on, its span has reached the collector when serve returns (the
// drain flushed it; the batch alone would wait 5 s); off, nothing is sent.
func TestServeTracing(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(map[bool]string{true: "on", false: "off"}[on], func(t *testing.T) {
			col := otlptest.Start(t)
			env := map[string]string{}
			if on {
				env["RLS_TRACING_ENDPOINT"] = col.Addr()
				env["RLS_TRACING_INSECURE"] = "true"
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var stderr logtest.Buffer
			done := make(chan error, 1)
			go func() {
				done <- run(ctx, []string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", "", "--log-format", "json"},
					&stderr, &stderr, func(k string) string { return env[k] })
			}()
			addr := grpcAddr(t, &stderr)
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			callCtx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
			req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{{
				Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.1"}},
			}}}
			if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(callCtx, req); err != nil {
				t.Fatal(err)
			}
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("serve: %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Fatal("serve did not stop after cancel")
			}
			spans := otlptest.Named(col.Spans(), service.SpanShouldRateLimit)
			if on && (len(spans) != 1 || spans[0].ParentID() != "00f067aa0ba902b7") {
				t.Fatalf("tracing on: %d %s spans when serve returned, want 1 child of Envoy's span", len(spans), service.SpanShouldRateLimit)
			}
			if on && spans[0].Resource["service.version"] != version() {
				t.Errorf("service.version %q, want %q", spans[0].Resource["service.version"], version())
			}
			if got := strings.Contains(stderr.String(), `"msg":"tracing on"`); got != on {
				t.Errorf("log has the \"tracing on\" line: %v, want %v", got, on)
			}
			if !on && col.Exports() != 0 {
				t.Fatalf("tracing off: the collector got %d exports, want none", col.Exports())
			}
		})
	}
}

// grpcAddr polls serve's log for its "serving" line and returns grpc_addr.
func grpcAddr(t *testing.T, stderr *logtest.Buffer) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, line := range strings.Split(stderr.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "serving" {
				if a, ok := m["grpc_addr"].(string); ok {
					return a
				}
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no serving line:\n%s", stderr.String())
	return ""
}
