package tracing_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rls/sluice/internal/otlptest"
	"github.com/sluice-rls/sluice/tracing"
)

// TestExportBothProtocols exports a span over OTLP/gRPC and OTLP/HTTP to
// a local receiver, with OpenTelemetry's standard variables for the
// service name, resource attributes and headers (on main: gRPC only, and
// OTEL_SERVICE_NAME ignored).
func TestExportBothProtocols(t *testing.T) {
	t.Setenv("OTEL_SERVICE_NAME", "edge-limits")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod,team=edge")
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=acme")
	for _, tc := range []struct {
		protocol string
		start    func(testing.TB) *otlptest.Collector
		endpoint func(*otlptest.Collector) string
	}{
		{tracing.ProtocolGRPC, otlptest.Start, func(c *otlptest.Collector) string { return c.Addr() }},
		{tracing.ProtocolGRPC, otlptest.Start, func(c *otlptest.Collector) string { return "http://" + c.Addr() }},
		{tracing.ProtocolHTTP, otlptest.StartHTTP, func(c *otlptest.Collector) string { return "http://" + c.Addr() }},
		{tracing.ProtocolHTTP, otlptest.StartHTTP, func(c *otlptest.Collector) string { return "http://" + c.Addr() + "/v1/traces" }},
	} {
		col := tc.start(t)
		endpoint := tc.endpoint(col)
		t.Run(tc.protocol+" "+endpoint, func(t *testing.T) {
			exportOne(t, tracing.Options{Endpoint: endpoint, Protocol: tc.protocol, Insecure: true, SampleRatio: 1, Version: "v1.2.3"}, col,
				map[string]string{"service.name": "edge-limits", "service.version": "v1.2.3", "deployment.environment": "prod", "team": "edge"})
			if got := col.Header("x-tenant"); len(got) != 1 || got[0] != "acme" {
				t.Errorf("header x-tenant = %q, want acme (OTEL_EXPORTER_OTLP_HEADERS)", got)
			}
		})
	}
}

// TestBadEndpointFailsAtStart: a collector that is not there, or speaks
// the other protocol, fails New at once with an error naming the endpoint
// (on main: "tracing on", and every span dropped).
func TestBadEndpointFailsAtStart(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := lis.Addr().String()
	lis.Close()
	grpcCol, httpCol := otlptest.Start(t), otlptest.StartHTTP(t)
	for _, tc := range []struct{ endpoint, protocol string }{
		{closed, tracing.ProtocolGRPC},
		{"http://" + closed, tracing.ProtocolHTTP},
		{httpCol.Addr(), tracing.ProtocolGRPC},
		{"http://" + grpcCol.Addr(), tracing.ProtocolHTTP},
	} {
		t0 := time.Now()
		p, err := tracing.New(context.Background(), tracing.Options{Endpoint: tc.endpoint, Protocol: tc.protocol, Insecure: true, SampleRatio: 1})
		if err == nil {
			_ = p.Shutdown(context.Background())
			t.Errorf("New(%s, %s) succeeded, want an error", tc.endpoint, tc.protocol)
			continue
		}
		if !strings.Contains(err.Error(), tc.endpoint) || !strings.Contains(err.Error(), tc.protocol) {
			t.Errorf("New(%s, %s) = %v, want it to name the endpoint and the protocol", tc.endpoint, tc.protocol, err)
		}
		if d := time.Since(t0); d > 6*time.Second {
			t.Errorf("New(%s, %s) took %v to fail", tc.endpoint, tc.protocol, d)
		}
	}
	if _, err := tracing.New(context.Background(), tracing.Options{Endpoint: grpcCol.Addr(), Protocol: "http/json", Insecure: true}); err == nil || !strings.Contains(err.Error(), "http/protobuf") {
		t.Errorf("New with protocol http/json = %v, want an error listing the protocols", err)
	}
}

// exportOne exports one span through a Provider of opts to col and checks
// the resource attributes of want on it.
func exportOne(t *testing.T, opts tracing.Options, col *otlptest.Collector, want map[string]string) {
	t.Helper()
	p, err := tracing.New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	_, span := p.Tracer().Start(context.Background(), "probe-span")
	span.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := otlptest.Named(col.Spans(), "probe-span")
	if len(spans) != 1 {
		t.Fatalf("%d spans named probe-span, want 1", len(spans))
	}
	for k, v := range want {
		if got := spans[0].Resource[k]; got != v {
			t.Errorf("resource %s = %q, want %q", k, got, v)
		}
	}
}
