package tracing

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/sluice-rls/sluice/internal/cputime"
)

// BenchmarkProcessor is the CPU time (the process', every thread, so the
// export goroutine's wake-ups count) per sampled span of the span
// processors: none (the baseline), sluice's batcher and the SDK's batch
// span processor, exporting to nothing. gap is busy work between two
// spans: 0 is a burst, 20µs spans as sparse as tracing 1% of a node's
// requests, where the SDK's goroutine parks after every span.
func BenchmarkProcessor(b *testing.B) {
	for _, gap := range []time.Duration{0, 20 * time.Microsecond} {
		for _, name := range []string{"none", "sluice", "sdk"} {
			b.Run(fmt.Sprintf("gap=%v/%s", gap, name), func(b *testing.B) {
				opts := []sdktrace.TracerProviderOption{sdktrace.WithSampler(sdktrace.AlwaysSample())}
				switch name {
				case "sluice":
					opts = append(opts, sdktrace.WithSpanProcessor(newBatcher(discardExporter{}, 0, slog.New(slog.DiscardHandler))))
				case "sdk":
					opts = append(opts, sdktrace.WithBatcher(discardExporter{}))
				}
				tp := sdktrace.NewTracerProvider(opts...)
				defer func() { _ = tp.Shutdown(context.Background()) }()
				tr := tp.Tracer("bench")
				ctx := context.Background()
				b.ReportAllocs()
				cpu0 := cputime.Process()
				for b.Loop() {
					_, span := tr.Start(ctx, "sluice.ShouldRateLimit")
					span.End()
					for t0 := time.Now(); time.Since(t0) < gap; {
					}
				}
				cputime.ReportPerOp(b, cpu0)
			})
		}
	}
}

type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }
