package redis

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// SpanScript names the span of a Hit that goes to Redis: its script calls
// (token_bucket.lua), and their NOSCRIPT retry or refund when there is one.
// Its attributes: the hits decided, the script calls the decision went out
// in (shared with concurrent decisions when they were batched), and whether
// it was allowed.
const SpanScript = "sluice.redis.token_bucket"

// Attribute names of SpanScript.
const (
	AttrHits    = "sluice.redis.hits"
	AttrCalls   = "sluice.redis.calls"
	AttrAllowed = "sluice.allowed"
)

// startSpan starts the span of a Hit with tracer (nil: none) when its
// caller's request is traced (its span is recording); otherwise it returns
// ctx and a nil span.
func startSpan(ctx context.Context, tracer trace.Tracer, hits int) (context.Context, trace.Span) {
	if tracer == nil || !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, nil
	}
	return tracer.Start(ctx, SpanScript, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.String("db.system.name", "redis"), attribute.Int(AttrHits, hits)))
}

// endSpan ends span (nil: none) with what r's decision did.
func endSpan(span trace.Span, r *request, allowed bool, err error) {
	if span == nil {
		return
	}
	span.SetAttributes(attribute.Int(AttrCalls, len(r.parts)), attribute.Bool(AttrAllowed, allowed && err == nil))
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
