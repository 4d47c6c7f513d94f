package tracing_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/sluice-rls/sluice/backend/memory"
	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/fallback"
	"github.com/sluice-rls/sluice/internal/otlptest"
	"github.com/sluice-rls/sluice/internal/redistest"
	"github.com/sluice-rls/sluice/ruleset"
	"github.com/sluice-rls/sluice/service"
	"github.com/sluice-rls/sluice/tracing"
)

// Envoy's trace context: one trace, two parent spans, sampled or not.
const (
	traceID       = "4bf92f3577b34da6a3ce929d0e0e4736"
	parentA       = "00f067aa0ba902b7"
	parentB       = "00f067aa0ba902b8"
	sampledA      = "00-" + traceID + "-" + parentA + "-01"
	sampledB      = "00-" + traceID + "-" + parentB + "-01"
	unsampledC    = "00-" + traceID + "-00f067aa0ba902b9-00"
	waitForSpans  = 10 * time.Second
	ruleUserLimit = `
domain: edge
descriptors:
  - key: user_id
    rate_limit: {unit: minute, requests_per_unit: 1}
`
)

func rules(t *testing.T, y string) service.RuleSource {
	t.Helper()
	f, err := descriptors.Parse("rules.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := descriptors.New([]*descriptors.File{f}, descriptors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return ruleset.NewStore(cfg)
}

// newProvider starts a provider exporting to c, never sampling root
// traces: only Envoy's sampled traces are followed.
func newProvider(t *testing.T, c *otlptest.Collector) *tracing.Provider {
	t.Helper()
	p, err := tracing.New(context.Background(), tracing.Options{Endpoint: c.Addr(), Insecure: true, SampleRatio: 0, Version: "v9.9.9-test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	return p
}

// newServer is a Server on ruleUserLimit, with a memory local layer, the
// given global layer, and tracer (nil: no tracing).
func newServer(t *testing.T, global bucket.Limiter, tracer trace.Tracer) *service.Server {
	t.Helper()
	return service.New(service.Options{
		GrayKey: service.DefaultGrayKey, // userRequest carries gray=false
		Rules:   rules(t, ruleUserLimit),
		Local:   memory.New(memory.Options{}),
		Global:  global,
		Tracer:  tracer,
	})
}

// brokenRedis fails every call, as a Redis that is down does.
type brokenRedis struct{}

func (brokenRedis) Hit(context.Context, []bucket.Hit, []bucket.State) (bucket.Decision, error) {
	return bucket.Decision{}, errors.New("connection refused")
}

func (brokenRedis) Shared() bool { return true }

// serveGRPC serves srv's RateLimitService on 127.0.0.1 with opts and
// returns a client.
func serveGRPC(t *testing.T, srv *service.Server, opts ...grpc.ServerOption) rlsv3.RateLimitServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(gs, srv)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(lis) }()
	t.Cleanup(func() { gs.Stop(); <-done })
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

func userRequest(user string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{{
		Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "user_id", Value: user}, {Key: "gray", Value: "false"}},
	}}}
}

// envoyHeaders are metadata Envoy's rate-limit calls carry besides trace
// context; traceState is the tracestate sent with a traceparent.
var envoyHeaders = []string{"x-envoy-internal", "true", "x-forwarded-for", "10.1.2.3", "x-envoy-expected-rq-timeout-ms", "20"}

const traceState = "envoy=t61rcWkgMzE"

func call(t *testing.T, c rlsv3.RateLimitServiceClient, traceparent string, want rlsv3.RateLimitResponse_Code) {
	t.Helper()
	ctx := metadata.AppendToOutgoingContext(context.Background(), envoyHeaders...)
	if traceparent != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", traceparent, "tracestate", traceState)
	}
	resp, err := c.ShouldRateLimit(ctx, userRequest("alice"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetOverallCode() != want {
		t.Fatalf("traceparent %q: %v, want %v", traceparent, resp.GetOverallCode(), want)
	}
}

func wantAttrs(t *testing.T, s otlptest.Span, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got, ok := s.Attr(k); !ok || got != v {
			t.Errorf("span %s (parent %s): attribute %s = %q (present %v), want %q", s.GetName(), s.ParentID(), k, got, ok, v)
		}
	}
}

// TestSpansOverGRPC sends real ShouldRateLimit calls over gRPC with Envoy's
// traceparent to a service whose Redis is down (answered by the fallback),
// and checks the spans an OTLP collector receives: one per sampled call,
// the child of Envoy's span, with a child for the fallback's answer; none
// for an unsampled or a root call (ratio 0). With the service's tap handle,
// as rls serve runs it, and without (the handler then reads the metadata).
func TestSpansOverGRPC(t *testing.T) {
	t.Run("tap", func(t *testing.T) { testSpansOverGRPC(t, true) })
	t.Run("no tap", func(t *testing.T) { testSpansOverGRPC(t, false) })
}

func testSpansOverGRPC(t *testing.T, withTap bool) {
	col := otlptest.Start(t)
	p := newProvider(t, col)
	fo := fallback.New(fallback.Options{
		Primary: brokenRedis{},
		Share:   memory.New(memory.Options{}),
		Probe:   func(context.Context) error { return errors.New("still down") },
		Nodes:   func() int { return 1 },
		Mode:    fallback.Share,
		Tracer:  p.Tracer(),
	})
	t.Cleanup(fo.Close)
	srv := newServer(t, fo, p.Tracer())
	var opts []grpc.ServerOption
	if withTap {
		opts = append(opts, grpc.InTapHandle(srv.TapHandle))
	}
	client := serveGRPC(t, srv, opts...)

	call(t, client, sampledA, rlsv3.RateLimitResponse_OK)
	call(t, client, unsampledC, rlsv3.RateLimitResponse_OVER_LIMIT)
	call(t, client, "", rlsv3.RateLimitResponse_OVER_LIMIT)
	call(t, client, sampledB, rlsv3.RateLimitResponse_OVER_LIMIT)
	// Shutdown flushes: the batch would otherwise wait its 5 s timeout.
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := col.WaitSpans(t, 4, waitForSpans)
	if len(spans) != 4 {
		t.Fatalf("got %d spans, want 4 (2 sampled calls, each with a fallback child)", len(spans))
	}
	calls := otlptest.Named(spans, service.SpanShouldRateLimit)
	fallbacks := otlptest.Named(spans, fallback.SpanName)
	if len(calls) != 2 || len(fallbacks) != 2 {
		t.Fatalf("spans %d %s and %d %s, want 2 of each", len(calls), service.SpanShouldRateLimit, len(fallbacks), fallback.SpanName)
	}
	byParent := map[string]otlptest.Span{}
	for _, s := range calls {
		byParent[s.ParentID()] = s
	}
	for parent, decision := range map[string]string{parentA: "OK", parentB: "OVER_LIMIT"} {
		s, ok := byParent[parent]
		if !ok {
			t.Fatalf("no %s span with parent %s (Envoy's span): parents %v", service.SpanShouldRateLimit, parent, byParent)
		}
		if s.TraceID() != traceID || s.GetTraceState() != traceState {
			t.Errorf("trace id %s, state %q; want Envoy's %s, %q", s.TraceID(), s.GetTraceState(), traceID, traceState)
		}
		if s.GetKind() != tracepb.Span_SPAN_KIND_SERVER {
			t.Errorf("kind %v, want server", s.GetKind())
		}
		wantAttrs(t, s, map[string]string{
			service.AttrDomain: "edge", service.AttrDecision: decision, service.AttrLayer: service.LayerFallback.String(),
			service.AttrDescriptors: "1", service.AttrRules: "1",
		})
		if s.Resource["service.name"] != "sluice" || s.Resource["service.version"] != "v9.9.9-test" {
			t.Errorf("resource %v, want service.name sluice and service.version v9.9.9-test", s.Resource)
		}
		var child *otlptest.Span
		for i := range fallbacks {
			if fallbacks[i].ParentID() == s.SpanID() {
				child = &fallbacks[i]
			}
		}
		if child == nil {
			t.Fatalf("no %s span under %s %s", fallback.SpanName, service.SpanShouldRateLimit, s.SpanID())
		}
		if child.TraceID() != traceID {
			t.Errorf("fallback span trace %s, want %s", child.TraceID(), traceID)
		}
		wantAttrs(t, *child, map[string]string{fallback.AttrMode: "share", "sluice.allowed": map[string]string{"OK": "true", "OVER_LIMIT": "false"}[decision]})
	}
}

// TestRedisScriptSpan checks the span of a script call to a real Redis,
// the child of the request's span, and the global layer's attribution.
func TestRedisScriptSpan(t *testing.T) {
	rs := redistest.Start(t)
	col := otlptest.Start(t)
	p := newProvider(t, col)
	client := rs.Client()
	t.Cleanup(func() { client.Close() })
	lim := redisbackend.New(redisbackend.Options{Client: client, Timeout: time.Second, Tracer: p.Tracer()})
	t.Cleanup(lim.Close)
	srv := newServer(t, lim, p.Tracer())
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("traceparent", sampledA))
	resp, err := srv.ShouldRateLimit(ctx, userRequest("bob-"+time.Now().Format(time.RFC3339Nano)))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("ShouldRateLimit: %v, %v; want OK", resp.GetOverallCode(), err)
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	spans := col.WaitSpans(t, 2, waitForSpans)
	top := otlptest.Named(spans, service.SpanShouldRateLimit)
	script := otlptest.Named(spans, redisbackend.SpanScript)
	if len(spans) != 2 || len(top) != 1 || len(script) != 1 {
		t.Fatalf("spans %d, want one %s and one %s", len(spans), service.SpanShouldRateLimit, redisbackend.SpanScript)
	}
	if top[0].ParentID() != parentA || script[0].ParentID() != top[0].SpanID() || script[0].TraceID() != traceID {
		t.Errorf("parents: request %s (want %s), script %s (want %s), script trace %s",
			top[0].ParentID(), parentA, script[0].ParentID(), top[0].SpanID(), script[0].TraceID())
	}
	wantAttrs(t, top[0], map[string]string{service.AttrLayer: service.LayerGlobal.String(), service.AttrDecision: "OK"})
	wantAttrs(t, script[0], map[string]string{redisbackend.AttrHits: "1", redisbackend.AttrCalls: "1", redisbackend.AttrAllowed: "true", "db.system.name": "redis"})
	if script[0].GetKind() != tracepb.Span_SPAN_KIND_CLIENT {
		t.Errorf("script span kind %v, want client", script[0].GetKind())
	}
}

// TestOff checks that without an endpoint there is no provider, no tracer,
// nothing installed globally, and that a service without a tracer takes no
// trace context from the call.
func TestOff(t *testing.T) {
	p, err := tracing.New(context.Background(), tracing.Options{SampleRatio: 1})
	if err != nil || p != nil {
		t.Fatalf("New without endpoint = %v, %v; want nil, nil", p, err)
	}
	if tr := p.Tracer(); tr != nil {
		t.Fatalf("Tracer of the nil provider = %v, want nil", tr)
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, ok := otel.GetTracerProvider().(*sdktrace.TracerProvider); ok {
		t.Fatal("a global SDK tracer provider is installed")
	}

	var seen trace.SpanContext
	srv := newServer(t, limiterFunc(func(ctx context.Context) {
		seen = trace.SpanContextFromContext(ctx)
	}), nil)
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("traceparent", sampledA))
	if _, err := srv.ShouldRateLimit(ctx, userRequest("carol")); err != nil {
		t.Fatal(err)
	}
	if seen.IsValid() {
		t.Fatalf("the global layer saw span context %v with tracing off, want none", seen)
	}
}

// limiterFunc allows every hit, calling f with the call's context.
type limiterFunc func(ctx context.Context)

func (f limiterFunc) Hit(ctx context.Context, hits []bucket.Hit, states []bucket.State) (bucket.Decision, error) {
	f(ctx)
	for i := range hits {
		states[i] = bucket.State{Allowed: true}
	}
	return bucket.Decision{Allowed: true}, nil
}

func (limiterFunc) Shared() bool { return true }

func TestBadRatio(t *testing.T) {
	for _, r := range []float64{-0.1, 1.5} {
		if p, err := tracing.New(context.Background(), tracing.Options{Endpoint: "127.0.0.1:1", SampleRatio: r}); err == nil {
			_ = p.Shutdown(context.Background())
			t.Errorf("ratio %v accepted", r)
		}
	}
}
