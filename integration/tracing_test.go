//go:build integration

package integration

import (
	"context"
	"os/exec"
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

// TestEnvoyGatewayTracing runs the binary as Envoy Gateway's rate-limit
// container does (/bin/ratelimit, envoyproxy/ratelimit's variables) with
// the variables Envoy Gateway adds for rateLimit.telemetry.tracing: the
// spans reach an OTLP/HTTP collector named by OTEL_EXPORTER_OTLP_ENDPOINT,
// under the service TRACING_SERVICE_* name.
func TestEnvoyGatewayTracing(t *testing.T) {
	t.Parallel()
	col := otlptest.StartHTTP(t)
	cmd := exec.Command(rlsBinary)
	cmd.Args[0] = "/bin/ratelimit"
	cmd.Env = rlsEnv("RLS_PEER_ENV=map", "RLS_GRPC_ADDR=127.0.0.1:0", "RLS_HTTP_ADDR=127.0.0.1:0", "RLS_ADMIN_ADDR=127.0.0.1:0",
		"TRACING_ENABLED=true", "TRACING_SERVICE_NAME=envoy-ratelimit", "TRACING_SERVICE_NAMESPACE=envoy-gateway-system",
		"TRACING_SERVICE_INSTANCE_ID=envoy-ratelimit-7c9f4-x2x9z", "TRACING_SAMPLING_RATE=1.0",
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://"+col.Addr())
	p := startCmd(t, cmd)
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	if _, err := p.Client.ShouldRateLimit(ctx, request("edge", "remote_address=10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	p.Signal(t, syscall.SIGTERM)
	if err := p.Wait(t, 30*time.Second); err != nil {
		t.Fatalf("rls exit after SIGTERM: %v", err)
	}
	spans := otlptest.Named(col.Spans(), "sluice.ShouldRateLimit")
	if len(spans) != 1 || spans[0].TraceID() != traceID {
		t.Fatalf("spans %v, want one sluice.ShouldRateLimit in trace %s", col.Spans(), traceID)
	}
	for k, want := range map[string]string{"service.name": "envoy-ratelimit", "service.namespace": "envoy-gateway-system", "service.instance.id": "envoy-ratelimit-7c9f4-x2x9z"} {
		if got := spans[0].Resource[k]; got != want {
			t.Errorf("resource %s = %q, want %q", k, got, want)
		}
	}
}
