package tracing

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
)

// Protocols of Options.Protocol: OTLP's, as OTEL_EXPORTER_OTLP_PROTOCOL
// names them.
const (
	ProtocolGRPC = "grpc"
	ProtocolHTTP = "http/protobuf"
)

// Protocols returns the protocols Options.Protocol takes.
func Protocols() []string { return []string{ProtocolGRPC, ProtocolHTTP} }

// probeTimeout bounds New's empty export to the collector.
const probeTimeout = 5 * time.Second

// tracesPath is where an OTLP/HTTP collector takes traces.
const tracesPath = "/v1/traces"

// newClient returns an OTLP client for opts' endpoint and protocol. The
// exporters read the other OTEL_EXPORTER_OTLP_* variables (headers,
// certificates, compression, timeout) from the environment themselves;
// what opts sets wins over them. retry false: one attempt per export.
func newClient(opts Options, retry bool) (otlptrace.Client, error) {
	endpoint, isURL := opts.Endpoint, strings.Contains(opts.Endpoint, "://")
	switch opts.Protocol {
	case "", ProtocolGRPC:
		o := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(endpoint)}
		if isURL {
			o = []otlptracegrpc.Option{otlptracegrpc.WithEndpointURL(endpoint)}
		}
		if opts.Insecure {
			o = append(o, otlptracegrpc.WithInsecure())
		}
		if !retry {
			o = append(o, otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{Enabled: false}))
		}
		return otlptracegrpc.NewClient(o...), nil
	case ProtocolHTTP:
		o := []otlptracehttp.Option{otlptracehttp.WithEndpoint(endpoint)}
		if isURL {
			u, err := url.Parse(endpoint)
			if err != nil {
				return nil, fmt.Errorf("tracing: endpoint: %w", err)
			}
			if u.Path == "" || u.Path == "/" {
				u.Path = tracesPath
			}
			o = []otlptracehttp.Option{otlptracehttp.WithEndpointURL(u.String())}
		}
		if opts.Insecure {
			o = append(o, otlptracehttp.WithInsecure())
		}
		if !retry {
			o = append(o, otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: false}))
		}
		return otlptracehttp.NewClient(o...), nil
	}
	return nil, fmt.Errorf("tracing: protocol %q: want %s", opts.Protocol, strings.Join(Protocols(), " or "))
}

// probe sends the collector an empty export, without retries, so that a
// wrong endpoint, protocol, TLS setting or header fails the start with a
// clear error instead of dropping every span later without a word.
func probe(ctx context.Context, opts Options) error {
	c, err := newClient(opts, false)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	if err = c.Start(ctx); err == nil {
		err = c.UploadTraces(ctx, nil)
		_ = c.Stop(context.Background())
	}
	if err != nil {
		return fmt.Errorf("tracing: the collector at %s (OTLP %s) refused an empty export: %w", opts.Endpoint, protocolName(opts.Protocol), err)
	}
	return nil
}

func protocolName(p string) string {
	if p == "" {
		return ProtocolGRPC
	}
	return p
}
