package tracing_test

import (
	"context"
	"fmt"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-rls/sluice/internal/otlptest"
)

// BenchmarkExport is what the OTLP exporter spends on a batch of spans
// like sluice's (server kind, five attributes), sent over gRPC to an
// in-process collector on 127.0.0.1 (whose decoding is counted too): the
// cost of a batch, to weigh against the heap that waiting spans hold.
func BenchmarkExport(b *testing.B) {
	for _, n := range []int{32, 64} {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			col := otlptest.Start(b)
			ctx := context.Background()
			exp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpoint(col.Addr()), otlptracegrpc.WithInsecure())
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = exp.Shutdown(ctx) })
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			tr := tp.Tracer("bench")
			for range n {
				_, span := tr.Start(ctx, "sluice.ShouldRateLimit", trace.WithSpanKind(trace.SpanKindServer))
				span.SetAttributes(attribute.String("sluice.domain", "edge"), attribute.Int("sluice.descriptors", 3),
					attribute.Int("sluice.rules", 3), attribute.String("sluice.layer", "global"), attribute.String("sluice.decision", "OK"))
				span.End()
			}
			spans := rec.Ended()
			for b.Loop() {
				if err := exp.ExportSpans(ctx, spans); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/span")
		})
	}
}
