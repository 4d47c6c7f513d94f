package service

import (
	"context"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
)

// Span and attribute names of the traces sluice writes (docs/operations.md
// "Tracing").
const (
	SpanShouldRateLimit = "sluice.ShouldRateLimit"

	AttrDomain      = "sluice.domain"
	AttrDecision    = "sluice.decision"    // OK or OVER_LIMIT
	AttrLayer       = "sluice.layer"       // local, global, fallback or none
	AttrDescriptors = "sluice.descriptors" // descriptors in the request
	AttrRules       = "sluice.rules"       // descriptors that matched a rule
)

// traceContext is W3C trace context (traceparent, tracestate), the format
// Envoy's tracers propagate over gRPC metadata.
var traceContext = propagation.TraceContext{}

// traceparent is the W3C trace context header (gRPC metadata key).
const traceparent = "traceparent"

// unsampled reports whether tp is a version-00 traceparent
// ("00-<trace id>-<parent id>-<flags>") whose sampled flag is clear.
// Anything else goes to the propagator, which validates it.
func unsampled(tp string) bool {
	if len(tp) != 55 || tp[:3] != "00-" || tp[35] != '-' || tp[52] != '-' {
		return false
	}
	switch f := tp[54]; {
	case '0' <= f && f <= '9':
		return (f-'0')&1 == 0
	case 'a' <= f && f <= 'f':
		return (f-'a'+10)&1 == 0
	}
	return false
}

// serverSpan are the start options of a request's span, made once.
var serverSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}

// mdCarrier reads trace context from a call's incoming gRPC metadata
// without copying the metadata.
type mdCarrier struct{ ctx context.Context }

func (c mdCarrier) Get(key string) string {
	if v := metadata.ValueFromIncomingContext(c.ctx, key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (mdCarrier) Set(string, string) {}
func (mdCarrier) Keys() []string     { return nil }

// traceNote is what decide tells the request's span.
type traceNote struct {
	layer Layer // the deciding layer; LayerNone: unknown domain, no matching rule, or every rule unlimited
	rules int   // descriptors that matched a rule
}

// note records how out was decided: by the refusing layer, else the
// deepest layer that answered.
func (n *traceNote) note(sc *scratch, out *outcome) {
	switch {
	case !out.allowed:
		n.layer = out.layer
	case out.globalDone:
		n.layer = out.globalLayer
	case out.localDone:
		n.layer = LayerLocal
	}
	for i := range sc.descs {
		if sc.descs[i].rule != nil {
			n.rules++
		}
	}
}

// shouldRateLimitTraced is ShouldRateLimit with a span, the child of the
// trace context Envoy sent in the call's metadata. It assumes the tracer
// samples ParentBased (as package tracing's does): a request whose parent
// Envoy did not sample gets no span.
func (s *Server) shouldRateLimitTraced(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	switch tp := (mdCarrier{ctx}).Get(traceparent); {
	case unsampled(tp):
		// Envoy did not sample this trace, so ParentBased sampling would
		// not either: skip the span's cost (ids, contexts) altogether.
		return s.shouldRateLimit(ctx, req, nil)
	case tp != "":
		ctx = traceContext.Extract(ctx, mdCarrier{ctx})
	}
	ctx, span := s.tracer.Start(ctx, SpanShouldRateLimit, serverSpan...)
	defer span.End()
	if !span.IsRecording() {
		return s.shouldRateLimit(ctx, req, nil)
	}
	n := traceNote{layer: LayerNone}
	resp, err := s.shouldRateLimit(ctx, req, &n)
	attrs := [...]attribute.KeyValue{
		attribute.String(AttrDomain, req.GetDomain()),
		attribute.Int(AttrDescriptors, len(req.GetDescriptors())),
		attribute.Int(AttrRules, n.rules),
		attribute.String(AttrLayer, n.layer.String()),
		attribute.String(AttrDecision, resp.GetOverallCode().String()),
	}
	if err != nil {
		span.SetAttributes(attrs[:2]...)
		span.SetStatus(codes.Error, err.Error())
		return resp, err
	}
	span.SetAttributes(attrs[:]...)
	return resp, err
}
