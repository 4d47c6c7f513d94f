package node

import (
	"context"
	"log/slog"
	"time"

	"github.com/sluice-rls/sluice/tracing"
)

// startTracing starts the OTLP exporter of --tracing-endpoint, which must
// take an empty export first; nil when tracing is off, which a nil
// Provider's methods take as off too.
func startTracing(ctx context.Context, st Options, log *slog.Logger) (*tracing.Provider, error) {
	traces, err := tracing.New(ctx, tracing.Options{
		Endpoint: st.TracingEndpoint, Protocol: st.TracingProtocol, Insecure: st.TracingInsecure, SampleRatio: st.TracingSampleRatio, Version: st.Build.Version, Resource: st.TracingResource, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	if traces != nil {
		log.Info("tracing on", "endpoint", st.TracingEndpoint, "protocol", st.TracingProtocol, "sample_ratio", st.TracingSampleRatio, "insecure", st.TracingInsecure)
	}
	return traces, nil
}

// shutdownTracing flushes the spans not yet exported, for up to timeout,
// and stops the exporter (nil: tracing off, nothing to do).
func shutdownTracing(p *tracing.Provider, timeout time.Duration, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		log.Warn("tracing: spans not flushed", "err", err)
	}
}
