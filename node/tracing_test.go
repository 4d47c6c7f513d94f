package node

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"

	"github.com/sluice-rls/sluice/internal/otlptest"
	"github.com/sluice-rls/sluice/service"
)

// TestServeTracing runs a node with and without TracingEndpoint, sends
// one call in a trace Envoy sampled, and stops the node: with tracing on,
// its span has reached the collector when Run returns (the drain flushed
// it; the batch alone would wait 5 s); off, nothing is sent.
func TestServeTracing(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(map[bool]string{true: "on", false: "off"}[on], func(t *testing.T) {
			col := otlptest.Start(t)
			opts := testOptions()
			opts.Build.Version = "v9.9.9-test"
			if on {
				opts.TracingEndpoint, opts.TracingInsecure = col.Addr(), true
			}
			rls := start(t, opts)
			callCtx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
			if _, err := rls.Client().ShouldRateLimit(callCtx, edgeRequest("remote_address", "10.0.0.1")); err != nil {
				t.Fatal(err)
			}
			if err := rls.Stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			spans := otlptest.Named(col.Spans(), service.SpanShouldRateLimit)
			if on && (len(spans) != 1 || spans[0].ParentID() != "00f067aa0ba902b7") {
				t.Fatalf("tracing on: %d %s spans when Run returned, want 1 child of Envoy's span", len(spans), service.SpanShouldRateLimit)
			}
			if on && spans[0].Resource["service.version"] != opts.Build.Version {
				t.Errorf("service.version %q, want %q", spans[0].Resource["service.version"], opts.Build.Version)
			}
			if got := strings.Contains(rls.Log.String(), `"msg":"tracing on"`); got != on {
				t.Errorf("log has the \"tracing on\" line: %v, want %v", got, on)
			}
			if !on && col.Exports() != 0 {
				t.Fatalf("tracing off: the collector got %d exports, want none", col.Exports())
			}
		})
	}
}
