package fallback

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// The span a fallback answer writes, and its attributes (docs/operations.md
// "Tracing").
const (
	SpanName    = "sluice.fallback"
	AttrMode    = "sluice.fallback.mode"
	AttrAllowed = "sluice.allowed"
)

// startSpan starts the span of a fallback answer when the request is
// traced; end it with endSpan.
func (l *Limiter) startSpan(ctx context.Context) (context.Context, trace.Span) {
	if l.opts.Tracer == nil || !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, nil
	}
	return l.opts.Tracer.Start(ctx, SpanName, trace.WithAttributes(attribute.String(AttrMode, l.opts.Mode.String())))
}

// endSpan ends span (nil: none), recording whether it refused.
func endSpan(span trace.Span, ok bool, err error) {
	if span == nil {
		return
	}
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.SetAttributes(attribute.Bool(AttrAllowed, ok))
	span.End()
}
