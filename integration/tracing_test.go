//go:build integration

package integration

import (
	"context"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/sluice-rls/sluice/internal/otlptest"
)

// TestServeTracing runs rls serve with --tracing-endpoint and calls it over
// gRPC as Envoy does, with trace context in sampled, unsampled and absent
// forms (ratio 0: roots never sampled): the collector gets one request
// span, the child of the sampled call's parent, flushed at SIGTERM.
func TestServeTracing(t *testing.T) {
	t.Parallel()
	col := otlptest.Start(t)
	p := startRLS(t, "--tracing-endpoint", col.Addr(), "--tracing-insecure", "--tracing-sample-ratio", "0")
	const (
		traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
		parent  = "00f067aa0ba902b7"
	)
	for _, tp := range []string{"00-" + traceID + "-" + parent + "-01", "00-" + traceID + "-00f067aa0ba902b9-00", ""} {
		ctx := metadata.AppendToOutgoingContext(context.Background(), "x-envoy-internal", "true")
		if tp != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", tp)
		}
		if _, err := p.Client.ShouldRateLimit(ctx, request("edge", "remote_address=10.0.0.1")); err != nil {
			t.Fatalf("traceparent %q: %v", tp, err)
		}
	}
	p.Signal(t, syscall.SIGTERM)
	if err := p.Wait(t, 30*time.Second); err != nil {
		t.Fatalf("rls exit after SIGTERM: %v", err)
	}
	spans := col.Spans()
	if len(spans) != 1 {
		t.Fatalf("%d spans exported, want 1 (the sampled call's): %v", len(spans), spans)
	}
	s := spans[0]
	if s.GetName() != "sluice.ShouldRateLimit" || s.TraceID() != traceID || s.ParentID() != parent {
		t.Errorf("span %s trace %s parent %s, want sluice.ShouldRateLimit in Envoy's trace %s under %s", s.GetName(), s.TraceID(), s.ParentID(), traceID, parent)
	}
	if d, ok := s.Attr("sluice.domain"); !ok || d != "edge" {
		t.Errorf("sluice.domain = %q, want edge", d)
	}
}
