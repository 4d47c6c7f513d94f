package node

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-rls/sluice/backend/memory"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/fallback"
	"github.com/sluice-rls/sluice/ruleset"
)

// backends are the node's two limiting layers as the service sees them.
type backends struct {
	// local is the per-node layer: a memory backend, behind the fail-open
	// switch's guard with Redis (--redis-failure allow bypasses it).
	local  bucket.Limiter
	global globalLayer
}

// newBackends builds the local layer and the global one (newGlobal),
// running their memory backends' eviction until ctx is done. The caller
// closes the global layer. rules are the rules the service decides by.
func newBackends(ctx context.Context, st Options, rules *ruleset.Store, log *slog.Logger, reg prometheus.Registerer, tracer trace.Tracer) (backends, error) {
	local := memory.New(memory.Options{MaxBuckets: st.MaxBuckets})
	go local.Run(ctx, memory.DefaultEvictEvery)
	registerBucketGauge(reg, "local", local.Len)
	registerFullRefusals(reg, "local", local.FullRefusals)
	global, err := newGlobal(ctx, st, rules, log, reg, tracer)
	if err != nil {
		return backends{}, err
	}
	b := backends{local: local, global: global}
	if global.sw != nil {
		b.local = global.sw.GuardLocal(local)
	}
	return b, nil
}

// globalLayer is the cluster-wide layer as the node wires it.
type globalLayer struct {
	limiter bucket.Limiter
	sw      *fallback.Limiter // the fail-open switch in front of Redis; nil without Redis
	// control is the client of what is off the request path: the audit
	// stream and the adaptive lock; controlOpts are its options, for the
	// runtime overrides' own client (pub/sub holds a connection). Both nil
	// without Redis.
	control     goredis.UniversalClient
	controlOpts *goredis.UniversalOptions
	close       func()
}

// backend names the global layer's backend in the "serving" log line.
func (g globalLayer) backend() string {
	if g.sw != nil {
		return "redis"
	}
	return "memory"
}

// state says who answers global rules, for /healthcheck: "memory" without
// Redis, "redis", or "fallback (<mode>)" while Redis is failing.
func (g globalLayer) state() string {
	if g.sw != nil {
		return g.sw.State()
	}
	return "memory"
}

// newGlobal builds the global layer: Redis behind the fail-open switch
// when --redis is set, else a memory backend holding global rules on this
// node.
func newGlobal(ctx context.Context, st Options, rules *ruleset.Store, log *slog.Logger, reg prometheus.Registerer, tracer trace.Tracer) (globalLayer, error) {
	if st.Redis == "" {
		m := memory.New(memory.Options{MaxBuckets: st.MaxBuckets})
		go m.Run(ctx, memory.DefaultEvictEvery)
		registerBucketGauge(reg, "global", m.Len)
		registerFullRefusals(reg, "global", m.FullRefusals)
		return globalLayer{limiter: m, close: func() {}}, nil
	}
	return newRedisGlobal(ctx, st, rules, log, reg, tracer)
}
