package service

import (
	"context"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/tap"
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

// The W3C trace context headers (gRPC metadata keys).
const (
	traceparent = "traceparent"
	tracestate  = "tracestate"
)

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

// mdCarrier reads trace context from gRPC metadata, as gRPC received it.
type mdCarrier metadata.MD

func (c mdCarrier) Get(key string) string {
	if v := c[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func (mdCarrier) Set(string, string) {}
func (mdCarrier) Keys() []string     { return nil }

// tapHeaderKey is the context key of a call's header, put there by
// TapHandle when it carries trace context.
type tapHeaderKey struct{}

// TapHandle is a gRPC tap handle (grpc.InTapHandle) for a Server with a
// Tracer: it finds Envoy's trace context in a call's header, before gRPC
// copies the header for the handler. Without it the handler reads the
// metadata through metadata.ValueFromIncomingContext, which copies the
// value and, when a call has no traceparent, compares every key of the
// header to it case-insensitively: 7% of a decision's CPU in the profile
// of BenchmarkTracing. A call with trace context costs one allocation
// here; one without, none. Install it on every gRPC server that serves s,
// or on none: once s has seen a call through it, calls it did not see are
// taken to carry no trace context.
func (s *Server) TapHandle(ctx context.Context, info *tap.Info) (context.Context, error) {
	if !s.traced {
		return ctx, nil
	}
	if !s.tapped.Load() {
		s.tapped.Store(true)
	}
	if len(info.Header[traceparent]) > 0 {
		ctx = context.WithValue(ctx, tapHeaderKey{}, info.Header)
	}
	return ctx, nil
}

// traceHeader is the header holding ctx's trace context, or nil if it has
// none: the one TapHandle kept; else, until a call has come through the
// tap (a gRPC server without it, direct calls), the call's incoming
// metadata. (The JSON endpoint's calls have no metadata: once the tap is
// in use they are not asked for it.)
func (s *Server) traceHeader(ctx context.Context) metadata.MD {
	if md, ok := ctx.Value(tapHeaderKey{}).(metadata.MD); ok {
		return md
	}
	if s.tapped.Load() {
		return nil // the tap saw this call (or it is no gRPC call): no trace context
	}
	tp := metadata.ValueFromIncomingContext(ctx, traceparent)
	if len(tp) == 0 {
		return nil
	}
	md := metadata.MD{traceparent: tp}
	if ts := metadata.ValueFromIncomingContext(ctx, tracestate); len(ts) > 0 {
		md[tracestate] = ts
	}
	return md
}

// startFunc is trace.Tracer's Start.
type startFunc func(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span)

// rootStarter is a tracer that can start a span its caller knows has no
// parent without looking for one in the context (package tracing's: a
// context walk saved on every call that came without trace context).
type rootStarter interface {
	StartRoot(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span)
}

// rootStart is t's StartRoot, or its Start.
func rootStart(t trace.Tracer) startFunc {
	if rs, ok := t.(rootStarter); ok {
		return rs.StartRoot
	}
	return t.Start
}

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
	start := s.startRoot
	if md := s.traceHeader(ctx); md != nil {
		if unsampled(mdCarrier(md).Get(traceparent)) {
			// Envoy did not sample this trace, so ParentBased sampling
			// would not either: skip the span's cost (ids, contexts).
			return s.shouldRateLimit(ctx, req, nil)
		}
		ctx, start = traceContext.Extract(ctx, mdCarrier(md)), s.tracer.Start
	}
	ctx, span := start(ctx, SpanShouldRateLimit, serverSpan...)
	if !span.IsRecording() {
		resp, err := s.shouldRateLimit(ctx, req, nil)
		span.End()
		return resp, err
	}
	defer span.End()
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
