package tracing

import (
	"context"
	"encoding/binary"
	"math/rand/v2"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Starting a span costs the SDK some hundreds of nanoseconds even when its
// sampler drops it (ids, sampler parameters, a span and a context
// allocated): a quarter of a rate-limit decision. rootTracer makes the
// root sampler's decision first, the SDK's way, on a trace id it draws,
// and starts nothing for a root trace that is not sampled; a sampled one is
// started with that trace id (idGenerator), on which the SDK's own
// ParentBased(TraceIDRatioBased) sampler decides the same. Spans with a
// parent go to the SDK as they are.

// rootTracer is the SDK's tracer with the root sampling decision made
// before Start.
type rootTracer struct {
	trace.Tracer        // the SDK's
	bound        uint64 // TraceIDRatioBased's: sampled when id[8:16] >> 1 < bound
	all          bool   // ratio ≥ 1: every root is sampled
}

// presetTraceID carries the trace id rootTracer drew to idGenerator.
type presetTraceID struct{}

// newRootTracer wraps t for the sampling ratio of the provider.
func newRootTracer(t trace.Tracer, ratio float64) trace.Tracer {
	rt := rootTracer{Tracer: t, all: ratio >= 1}
	if ratio > 0 && ratio < 1 {
		rt.bound = uint64(ratio * (1 << 63)) // as sdktrace.TraceIDRatioBased
	}
	return rt
}

// Start implements trace.Tracer.
func (t rootTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if trace.SpanContextFromContext(ctx).IsValid() {
		return t.Tracer.Start(ctx, name, opts...) // the parent decides
	}
	return t.StartRoot(ctx, name, opts...)
}

// StartRoot is Start for a span its caller knows has no parent in ctx (a
// call that came without trace context): it does not look for one.
func (t rootTracer) StartRoot(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	if t.all {
		return t.Tracer.Start(ctx, name, opts...)
	}
	// TraceIDRatioBased decides on the id's last 8 bytes: draw them first.
	lo := rand.Uint64()
	if lo>>1 >= t.bound {
		// Not sampled: nothing started. ctx has no valid span context, so
		// whatever span it holds does not record either: the no-op span
		// stands for it without a walk up ctx.
		return ctx, noop.Span{}
	}
	var tid trace.TraceID
	binary.BigEndian.PutUint64(tid[8:], lo)
	for !tid.IsValid() {
		binary.NativeEndian.PutUint64(tid[:8], rand.Uint64())
	}
	return t.Tracer.Start(context.WithValue(ctx, presetTraceID{}, tid), name, opts...)
}

// idGenerator is the SDK's random ids, but for the trace id rootTracer drew.
type idGenerator struct{}

var _ sdktrace.IDGenerator = idGenerator{}

// NewIDs implements sdktrace.IDGenerator.
func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	tid, ok := ctx.Value(presetTraceID{}).(trace.TraceID)
	for !ok || !tid.IsValid() {
		binary.NativeEndian.PutUint64(tid[:8], rand.Uint64())
		binary.NativeEndian.PutUint64(tid[8:], rand.Uint64())
		ok = true
	}
	return tid, newSpanID()
}

// NewSpanID implements sdktrace.IDGenerator.
func (idGenerator) NewSpanID(context.Context, trace.TraceID) trace.SpanID { return newSpanID() }

func newSpanID() trace.SpanID {
	var sid trace.SpanID
	for !sid.IsValid() {
		binary.NativeEndian.PutUint64(sid[:], rand.Uint64())
	}
	return sid
}
