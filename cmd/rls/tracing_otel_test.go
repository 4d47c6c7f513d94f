package main

import (
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc/metadata"

	"github.com/sluice-rls/sluice/internal/otlptest"
	"github.com/sluice-rls/sluice/service"
)

// TestServeTracingFromOTelEnv: OTEL_EXPORTER_OTLP_ENDPOINT alone turns
// tracing on, over OTLP/HTTP (OpenTelemetry's default protocol), and
// OTEL_SERVICE_NAME names the service (on main: nothing was exported).
func TestServeTracingFromOTelEnv(t *testing.T) {
	col := otlptest.StartHTTP(t)
	t.Setenv("OTEL_SERVICE_NAME", "edge-limits") // read by the SDK's resource
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + col.Addr()}
	rls := serveInProcess(t, func(k string) string { return env[k] }, loopback()...)
	callCtx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	if _, err := rls.Client().ShouldRateLimit(callCtx, edgeRequest("remote_address", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	if err := rls.Stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	spans := otlptest.Named(col.Spans(), service.SpanShouldRateLimit)
	if len(spans) != 1 || spans[0].Resource["service.name"] != "edge-limits" {
		t.Fatalf("%d %s spans (%v) when serve returned, want 1 of service edge-limits", len(spans), service.SpanShouldRateLimit, spans)
	}
	if !strings.Contains(rls.Log.String(), `"protocol":"http/protobuf"`) {
		t.Errorf("the tracing on line does not say http/protobuf:\n%s", rls.Log.String())
	}
}

// TestServeTracingBadEndpoint: a collector that does not answer fails
// rls serve at start, naming it (on main: "tracing on", no span ever
// exported, and the error only at SIGTERM).
func TestServeTracingBadEndpoint(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := lis.Addr().String()
	lis.Close()
	env := map[string]string{"RLS_TRACING_ENDPOINT": closed, "RLS_TRACING_INSECURE": "true"}
	rls := serveInProcess(t, func(k string) string { return env[k] }, loopback()...)
	err = rls.Stop()
	if err == nil || !strings.Contains(err.Error(), closed) {
		t.Fatalf("serve with a closed collector port: %v, want an error naming %s\n%s", err, closed, rls.Log.String())
	}
	if strings.Contains(rls.Log.String(), `"msg":"serving"`) {
		t.Errorf("serve served with a collector that does not answer:\n%s", rls.Log.String())
	}
}
