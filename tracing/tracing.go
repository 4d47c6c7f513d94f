// Package tracing builds sluice's OpenTelemetry tracer provider: spans are
// exported over OTLP (gRPC or HTTP/protobuf), sampled
// ParentBased(TraceIDRatioBased(ratio)) so that a trace Envoy sampled is
// followed whatever the ratio. The resource and the exporter read
// OpenTelemetry's standard variables (OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES, OTEL_EXPORTER_OTLP_HEADERS, ...) from the
// environment; cmd/rls/flags maps those that have a flag.
//
// Nothing here is global: the provider is built by cmd/rls and its Tracer
// handed to service.Options and backend/redis.Options; otel's global
// provider and propagator are never set. (The SDK and the exporter report
// a few internal errors through otel's global error handler, which sluice
// leaves as it is: plain lines on stderr. Export failures and dropped
// spans go to Options.Logger.)
package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// ServiceName is the service.name resource attribute of sluice's spans.
const ServiceName = "sluice"

// InstrumentationName names sluice's tracer (the instrumentation scope).
const InstrumentationName = "github.com/sluice-rls/sluice"

// Options configures a Provider.
type Options struct {
	// Endpoint is the collector: host:port, or a URL whose scheme says
	// whether TLS is used (http: plaintext). With ProtocolHTTP, a URL
	// without a path gets /v1/traces. Empty: tracing off.
	Endpoint string
	// Protocol is ProtocolGRPC (empty: the same) or ProtocolHTTP.
	Protocol string
	// Insecure sends spans without TLS; otherwise the collector's
	// certificate is checked against the system roots.
	Insecure bool
	// SampleRatio is the share of root traces sampled, in [0, 1]; a
	// request whose parent (Envoy's traceparent) is sampled is always
	// traced, one whose parent is not never is.
	SampleRatio float64
	// Version is the service.version resource attribute.
	Version string
	// Resource holds resource attributes that win over the environment's
	// (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES) and sluice's defaults.
	Resource Resource
	// Exporter, when set, receives the spans instead of an OTLP exporter
	// to Endpoint (tests and benchmarks); tracing is then on.
	Exporter sdktrace.SpanExporter
	// BatchTimeout is the longest a finished span waits before export
	// (0: 5 s). A batch of 512 spans goes at once.
	BatchTimeout time.Duration
	// Logger gets the exporter's failures and dropped spans (nil: discard).
	Logger *slog.Logger
}

// Provider is a running tracer provider with its exporter. Shut it down to
// flush the spans it holds.
type Provider struct {
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
}

// New starts a Provider exporting to opts.Endpoint. It returns nil, and no
// error, when opts.Endpoint is empty: tracing is off, and callers pass a
// nil trace.Tracer on (see Provider.Tracer). It first sends the collector
// an empty export: a collector that does not take it (unreachable, another
// protocol, TLS or headers it refuses) is an error here, not spans dropped
// later. The resource's service.name is ServiceName unless
// OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES or opts.Resource set it.
func New(ctx context.Context, opts Options) (*Provider, error) {
	if opts.Endpoint == "" && opts.Exporter == nil {
		return nil, nil
	}
	if !(opts.SampleRatio >= 0 && opts.SampleRatio <= 1) {
		return nil, fmt.Errorf("tracing: sample ratio must be in [0, 1], not %v", opts.SampleRatio)
	}
	exp := opts.Exporter
	if exp == nil {
		if err := probe(ctx, opts); err != nil {
			return nil, err
		}
		client, err := newClient(opts, true)
		if err != nil {
			return nil, err
		}
		if exp, err = otlptrace.New(ctx, client); err != nil {
			return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
		}
	}
	// Later detectors win: the environment's over sluice's defaults, and
	// opts.Resource over both.
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.name", ServiceName), attribute.String("service.version", opts.Version)),
		resource.WithFromEnv(),
		resource.WithAttributes(opts.Resource...),
	)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("tracing: resource: %w", err), exp.Shutdown(ctx))
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSpanProcessor(newBatcher(exp, opts.BatchTimeout, log)),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(opts.SampleRatio))),
		sdktrace.WithIDGenerator(idGenerator{}),
	)
	return &Provider{tp: tp, tracer: newRootTracer(tp.Tracer(InstrumentationName), opts.SampleRatio)}, nil
}

// Tracer returns sluice's tracer, or nil when p is nil (tracing off): the
// service and the Redis backend then trace nothing and pay nothing. A root
// span (one without a parent) that the sampler would drop is not started at
// all: Start returns its context unchanged and a no-op span.
func (p *Provider) Tracer() trace.Tracer {
	if p == nil {
		return nil
	}
	return p.tracer
}

// ForceFlush exports the spans not yet exported, within ctx. A nil
// Provider does nothing.
func (p *Provider) ForceFlush(ctx context.Context) error {
	if p == nil {
		return nil
	}
	return p.tp.ForceFlush(ctx)
}

// Shutdown flushes the spans not yet exported, within ctx, and stops the
// exporter. A nil Provider does nothing.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil {
		return nil
	}
	return p.tp.Shutdown(ctx)
}
