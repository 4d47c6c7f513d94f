package tracing

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestRootSampling checks that the root decision made before Start samples
// root traces at the ratio and that the SDK's sampler keeps every one of
// them (it decides on the same trace id): the rate is the ratio, not its
// square. Spans with a parent go to the SDK: sampled parents are followed.
func TestRootSampling(t *testing.T) {
	const n = 20000
	for _, tc := range []struct {
		ratio    float64
		min, max int // of n roots; 0.25: mean 5000, sd 61
	}{{0, 0, 0}, {0.25, 4600, 5400}, {1, n, n}} {
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(
			sdktrace.WithSpanProcessor(rec),
			sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(tc.ratio))),
			sdktrace.WithIDGenerator(idGenerator{}),
		)
		tr := newRootTracer(tp.Tracer("test"), tc.ratio)
		started := 0
		for range n {
			ctx, span := tr.Start(context.Background(), "root")
			if span.IsRecording() {
				started++
				if trace.SpanFromContext(ctx) != span {
					t.Fatal("a sampled root's context does not hold its span")
				}
			} else if ctx != context.Background() {
				t.Fatal("a dropped root changed the context")
			}
			span.End()
		}
		if got := len(rec.Ended()); got != started || got < tc.min || got > tc.max {
			t.Errorf("ratio %v: %d roots recording, %d ended; want %d–%d, all ended", tc.ratio, started, got, tc.min, tc.max)
		}

		// A sampled parent is followed whatever the ratio, an unsampled one never.
		for _, sampled := range []bool{true, false} {
			flags := trace.TraceFlags(0)
			if sampled {
				flags = trace.FlagsSampled
			}
			parent := trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
				TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: flags, Remote: true,
			}))
			_, span := tr.Start(parent, "child")
			if span.IsRecording() != sampled || span.SpanContext().TraceID() != (trace.TraceID{1}) {
				t.Errorf("ratio %v, parent sampled %v: child recording %v, trace %v", tc.ratio, sampled, span.IsRecording(), span.SpanContext().TraceID())
			}
			span.End()
		}
		_ = tp.Shutdown(context.Background())
	}
}
