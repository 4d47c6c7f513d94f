package node

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-rls/sluice/backend/lease"
	"github.com/sluice-rls/sluice/backend/memory"
	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	standing "github.com/sluice-rls/sluice/backend/share" // the fallback's memory is its share
	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/fallback"
	"github.com/sluice-rls/sluice/ruleset"
)

// stallCalls: Redis is suspected stalled, not just slow, once calls have
// timed out for this many --redis-timeout periods with no success between.
const stallCalls = 3

// A suspected stall switches the node only if a probe with this deadline
// fails too: confirmCalls × --redis-timeout, at least confirmFloor (the
// deadline of the probe in fallback). On a starved CPU calls miss 10 ms
// for a moment, and on a saturated 2-core test machine a probe missed
// 250 ms now and then; a second is a Redis that is down.
const (
	confirmCalls = 10
	confirmFloor = time.Second
)

// newRedisGlobal connects the global layer to --redis, wrapped in the
// fail-open switch: a memory fallback enforcing this node's share, the
// node registry that gives N, and the probe. The layer keeps a control
// client beside the decisions' (controlOptions), for the audit stream and
// the adaptive lock, and its options, for the runtime overrides' own
// client (pub/sub holds a connection).
func newRedisGlobal(ctx context.Context, st Options, rules *ruleset.Store, log *slog.Logger, reg prometheus.Registerer, tracer trace.Tracer) (globalLayer, error) {
	opts, err := redisbackend.ParseURL(st.Redis, st.RedisTimeout)
	if err != nil {
		return globalLayer{}, fmt.Errorf("--redis: %w", err)
	}
	if st.RedisCA != "" {
		if err := TrustCA(opts, st.RedisCA); err != nil {
			return globalLayer{}, err
		}
	}
	if st.RedisTLSCert != "" {
		if err := useRedisClientCert(opts, st, clockwork.NewRealClock(), log, reg); err != nil {
			return globalLayer{}, err
		}
	}
	// go-redis logs through a package-level logger; route it to ours so its
	// lines follow --log-format and --log-level.
	goredis.SetLogger(redisLogger{log})
	client := goredis.NewUniversalClient(opts)
	controlOpts := controlOptions(opts)
	control := goredis.NewUniversalClient(controlOpts)
	lim := redisbackend.New(redisbackend.Options{Client: client, Timeout: st.RedisTimeout, Tracer: tracer})

	nodes := redisbackend.NewNodes(redisbackend.NodesOptions{Client: client, ID: nodeName()})
	watchShareDigest(st, rules, nodes, reg) // before the first heartbeat
	fn := fallbackNodes{pinned: st.FallbackNodes, initial: st.FallbackNodesInitial, registry: nodes}
	nodeCount := func() int { n, _ := fn.count(); return n }
	fn.register(reg)
	nodesCtx, stopNodes := context.WithCancel(ctx)
	nodesDone := make(chan struct{})
	beatFailures := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ratelimit_heartbeat_failures_total",
		Help: "Heartbeats to the Redis node registry that failed (Redis down, slow or refusing the script); while they fail, ratelimit_live_nodes keeps its last count and no standing share is held past its heartbeat.",
	})
	reg.MustRegister(beatFailures)
	go func() {
		defer close(nodesDone)
		nodes.Run(nodesCtx, func(err error) {
			beatFailures.Inc()
			log.Debug("node heartbeat failed", "err", err) // at debug: once a second while Redis is down
		})
	}()

	share := memory.New(memory.Options{MaxBuckets: st.MaxBuckets})
	go share.Run(ctx, memory.DefaultEvictEvery)
	registerBucketGauge(reg, "fallback", share.Len)
	registerFullRefusals(reg, "fallback", share.FullRefusals)

	// The leased layer passes hits of exact rules to lim untouched; its
	// loop, which gives back expired leases and prefetches, starts at the
	// first leased hit (whenever the rules come to lease) and stops at
	// Close.
	leased := lease.New(lease.Options{
		Leaser: lim, Exact: lim, Default: st.Consistency, Period: st.LeasePeriod,
		Nodes: nodeCount, Metrics: lease.NewMetrics(reg), Autostart: true,
	})

	sw := fallback.New(fallback.Options{
		Primary:   leased,
		Share:     share,
		Probe:     lim.Ping,
		Nodes:     nodeCount,
		Mode:      st.RedisFailure,
		Classify:  redisbackend.ErrorKind,
		Abandoned: func(err error) bool { return errors.Is(err, redisbackend.ErrAbandoned) },
		// A stalled Redis fails every call; a busy one fails a few while
		// others succeed, and those few must not send the node to fallback.
		StallAfter: stallCalls * st.RedisTimeout,
		Confirm:    max(confirmFloor, confirmCalls*st.RedisTimeout),
		Logger:     log,
		Metrics:    fallback.NewMetrics(reg, redisbackend.ErrorKinds()),
		Tracer:     tracer,
	})
	closeAll := func() {
		sw.Close()
		// SIGTERM: the node's unused leased tokens go back to Redis.
		if err := leased.Close(ctx); err != nil {
			log.Warn("leased tokens not given back", "err", err)
		}
		stopNodes()
		<-nodesDone // it deregisters this node before the client closes
		lim.Close() // fails what is queued, waits for calls in flight
		_ = client.Close()
		_ = control.Close()
	}
	// Standing shares in front of the switch: they keep deciding while
	// Redis fails. Wired whatever the rules: a reload may add a share, and
	// every node must then split the limit alike (decision 0021).
	shares := standing.New(standing.Options{Inner: sw, Membership: nodes, Default: st.shareDefault(), MaxBuckets: st.MaxBuckets, Metrics: standing.NewMetrics(reg)})
	go shares.Run(ctx)
	registerBucketGauge(reg, "share", shares.Len)
	standing.RegisterNodes(reg, nodes.Share)
	return globalLayer{limiter: shares, sw: sw, control: control, controlOpts: controlOpts, close: closeAll}, nil
}

// shareDefault is the standing shares' Default: --share in millionths, 0
// under --quota-mode, where every rule is a quota, whose charges land in
// Redis.
func (o *Options) shareDefault() uint32 {
	if o.QuotaMode {
		return 0
	}
	return descriptors.Millionths(o.Share)
}

// controlTimeout bounds a control call's reads and writes on the socket.
// Each caller's context brings a sooner deadline (the override Manager's
// and the audit stream's one second).
const controlTimeout = 5 * time.Second

// controlOptions are the options of the clients that read and write
// overrides, audit events and the adaptive lock: the decisions' (address,
// TLS, client certificate, sockets) without their socket timeouts, which
// are the backstop of --redis-timeout (10 × 10ms by default). go-redis
// takes the sooner of a socket timeout and the context's deadline, so with
// the decisions' an operator's override failed whenever Redis or the node
// stalled for 100ms.
func controlOptions(o *goredis.UniversalOptions) *goredis.UniversalOptions {
	c := *o
	c.ReadTimeout, c.WriteTimeout, c.PoolTimeout = controlTimeout, controlTimeout, controlTimeout
	return &c
}

// Sources of N, the values of ratelimit_fallback_nodes' source label.
const (
	nodesFromFlag     = "flag"     // --fallback-nodes pins N
	nodesFromRegistry = "registry" // the live count from heartbeats
	nodesFromInitial  = "initial"  // --fallback-nodes-initial, before the registry
	nodesFromDefault  = "default"  // DefaultFallbackNodesInitial, before the registry
)

// nodeCounter is the node registry as fallbackNodes reads it.
type nodeCounter interface {
	Count() int
	Seen() bool
}

// fallbackNodes chooses N, the node count of the fallback share rate/N:
// --fallback-nodes when set; otherwise the registry's live count once a
// heartbeat has succeeded; before that --fallback-nodes-initial, or
// DefaultFallbackNodesInitial. N is never 1 merely because Redis was never reached.
type fallbackNodes struct {
	pinned, initial int
	registry        nodeCounter
}

// count returns N and its source.
func (f fallbackNodes) count() (int, string) {
	switch {
	case f.pinned > 0:
		return f.pinned, nodesFromFlag
	case f.registry.Seen():
		return f.registry.Count(), nodesFromRegistry
	case f.initial > 0:
		return f.initial, nodesFromInitial
	default:
		return DefaultFallbackNodesInitial, nodesFromDefault
	}
}

// register adds ratelimit_live_nodes (N) and ratelimit_fallback_nodes (N
// under the source in use, 0 under the others) to reg.
func (f fallbackNodes) register(reg prometheus.Registerer) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ratelimit_live_nodes",
		Help: "The N of the fallback share: live sluice nodes seen through Redis heartbeats, or --fallback-nodes; before the first heartbeat, --fallback-nodes-initial or its default (see ratelimit_fallback_nodes).",
	}, func() float64 { n, _ := f.count(); return float64(n) }))
	for _, src := range []string{nodesFromFlag, nodesFromRegistry, nodesFromInitial, nodesFromDefault} {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "ratelimit_fallback_nodes",
			Help:        "The N of the fallback share under the source it comes from (flag: --fallback-nodes, registry: Redis heartbeats, initial: --fallback-nodes-initial before the first heartbeat, default: the built-in 10 before it); 0 under the other sources.",
			ConstLabels: prometheus.Labels{"source": src},
		}, func() float64 {
			if n, s := f.count(); s == src {
				return float64(n)
			}
			return 0
		}))
	}
}

// redisLogger adapts slog to go-redis' logger interface.
type redisLogger struct{ log *slog.Logger }

// Printf logs one go-redis message at debug level: connection problems it
// reports are already visible as failed calls, fallback and metrics.
func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.Debug("go-redis: " + fmt.Sprintf(format, v...))
}

// TrustCA makes a rediss:// connection verify Redis' certificate against
// the PEM bundle in file instead of the system roots.
func TrustCA(opts *goredis.UniversalOptions, file string) error {
	if opts.TLSConfig == nil {
		return fmt.Errorf("--redis-ca needs a TLS URL (rediss:// or sentinels://)")
	}
	pem, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("--redis-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("--redis-ca %s: no PEM certificates", file)
	}
	opts.TLSConfig.RootCAs = pool
	return nil
}
