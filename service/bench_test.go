package service_test

import (
	"context"
	"testing"

	"github.com/jonboulle/clockwork"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	"github.com/sluice-rls/sluice/backend/memory"
	"github.com/sluice-rls/sluice/service"
	"github.com/sluice-rls/sluice/tracing"
)

// BenchmarkShouldRateLimit is an Envoy-like request of three descriptors
// (remote_address, user_id, route+user_id) through the handler on memory
// backends, the buckets never running dry. The goal (docs/benchmarks.md): < 1 µs and
// ≤ 2 allocations per request. "sharedkeys" hashes global bucket keys with
// SHA-256, as with Redis; "nodekeys" is the memory-only deployment, whose
// keys never leave the process.
func BenchmarkShouldRateLimit(b *testing.B) {
	for _, bc := range []struct {
		name           string
		metrics        bool
		globalInMemory bool
		one            bool // one descriptor (remote_address) instead of three
		// tracing: none (""); a tracer provider sampling root traces at
		// 1% ("root"), with Envoy's trace context in the metadata:
		// "unsampled" (traceparent flags 00) or "sampled" (01); at ratio
		// 0 or 1 without trace context ("ratio0", "ratio1").
		tracing string
	}{
		{"sharedkeys/metrics=off", false, false, false, ""},
		{"sharedkeys/metrics=on", true, false, false, ""},
		{"nodekeys/metrics=on", true, true, false, ""},
		{"nodekeys/metrics=on/1descriptor", true, true, true, ""},
		{"tracing=0.01/sharedkeys/metrics=on", true, false, false, "root"},
		{"tracing=0.01/unsampled-parent/sharedkeys/metrics=on", true, false, false, "unsampled"},
		{"tracing=0.01/sampled-parent/sharedkeys/metrics=on", true, false, false, "sampled"},
		// What the 1% is made of: every request's cost (ratio 0) and a
		// sampled span's (ratio 1).
		{"tracing=0/sharedkeys/metrics=on", true, false, false, "ratio0"},
		{"tracing=1/sharedkeys/metrics=on", true, false, false, "ratio1"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			clock := clockwork.NewFakeClockAt(harnessStart)
			h := newHarnessOn(b, clock, `
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 4000000000
      local: {unit: second, requests_per_unit: 4000000000}
  - key: user_id
    rate_limit: {unit: second, requests_per_unit: 4000000000}
  - key: route
    value: /api/orders*
    descriptors:
      - key: user_id
        rate_limit: {unit: second, requests_per_unit: 4000000000}
`, func(o *service.Options) {
				if !bc.metrics {
					o.Metrics = nil
				}
				if bc.globalInMemory {
					o.Global = memory.New(memory.Options{Clock: clock})
				}
				switch bc.tracing {
				case "":
				case "ratio0":
					o.Tracer = benchTracer(b, 0)
				case "ratio1":
					o.Tracer = benchTracer(b, 1)
				default:
					o.Tracer = benchTracer(b, 0.01)
				}
			})
			req := request("edge", desc("remote_address=10.1.2.3"), desc("user_id=alice"), desc("route=/api/orders/42", "user_id=alice"))
			if bc.one {
				req = request("edge", desc("remote_address=10.1.2.3"))
			}
			ctx := context.Background()
			switch bc.tracing {
			case "unsampled":
				ctx = withTraceparent(ctx, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
			case "sampled":
				ctx = withTraceparent(ctx, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
			}
			b.ReportAllocs()
			cpu0 := processCPU()
			for b.Loop() {
				if _, err := h.srv.ShouldRateLimit(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
			if cpu := processCPU(); cpu0 > 0 {
				b.ReportMetric(float64(cpu-cpu0)/float64(b.N), "cpu-ns/op")
			}
		})
	}
}

// benchTracer is the tracer of `rls serve --tracing-sample-ratio ratio`,
// its spans batched to an exporter that drops them.
func benchTracer(b *testing.B, ratio float64) trace.Tracer {
	p, err := tracing.New(context.Background(), tracing.Options{Exporter: discardExporter{}, SampleRatio: ratio})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	return p.Tracer()
}

// withTraceparent is ctx as a gRPC handler gets it from Envoy with tracing.
func withTraceparent(ctx context.Context, tp string) context.Context {
	return metadata.NewIncomingContext(ctx, metadata.Pairs("traceparent", tp))
}

type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }
