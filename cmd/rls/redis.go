package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/backend/memory"
	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/config"
	"github.com/sluice-rls/sluice/service"
)

// newRedisGlobal connects the global layer to --redis, wrapped in the
// fail-open switch: a memory fallback enforcing this node's share, the
// node registry that gives N, and the probe.
func newRedisGlobal(ctx context.Context, st config.Settings, log *slog.Logger, reg prometheus.Registerer) (service.Limiter, string, func(), error) {
	opts, err := redisbackend.ParseURL(st.Redis, st.RedisTimeout)
	if err != nil {
		return nil, "", nil, fmt.Errorf("--redis: %w", err)
	}
	if st.RedisCA != "" {
		if err := trustCA(opts, st.RedisCA); err != nil {
			return nil, "", nil, err
		}
	}
	// go-redis logs through a package-level logger; route it to ours so its
	// lines follow --log-format and --log-level.
	goredis.SetLogger(redisLogger{log})
	client := goredis.NewUniversalClient(opts)
	lim := redisbackend.New(redisbackend.Options{Client: client, Timeout: st.RedisTimeout})

	host, _ := os.Hostname()
	nodes := redisbackend.NewNodes(redisbackend.NodesOptions{Client: client, ID: host + ":" + strconv.Itoa(os.Getpid())})
	nodeCount := nodes.Count
	if st.FallbackNodes > 0 {
		nodeCount = func() int { return st.FallbackNodes }
	}
	nodesCtx, stopNodes := context.WithCancel(ctx)
	nodesDone := make(chan struct{})
	go func() {
		defer close(nodesDone)
		nodes.Run(nodesCtx, func(err error) { log.Debug("node heartbeat failed", "err", err) })
	}()
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ratelimit_live_nodes",
		Help: "Live sluice nodes seen through Redis heartbeats (the N of the fallback share), or --fallback-nodes.",
	}, func() float64 { return float64(nodeCount()) }))

	fallback := memory.New(memory.Options{MaxBuckets: st.MaxBuckets})
	go fallback.Run(ctx, evictEvery)
	registerBucketGauge(reg, "fallback", fallback.Len)
	registerFullRefusals(reg, "fallback", fallback.FullRefusals)

	mode, _ := service.ParseFailureMode(st.RedisFailure) // validated with the flags
	failover := service.NewFailover(service.FailoverOptions{
		Primary:  lim,
		Fallback: fallback,
		Probe:    lim.Ping,
		Nodes:    nodeCount,
		Mode:     mode,
		Classify: redisbackend.ErrorKind,
		Logger:   log,
		Metrics:  service.NewFailoverMetrics(reg),
	})
	closeAll := func() {
		failover.Close()
		stopNodes()
		<-nodesDone // it deregisters this node before the client closes
		lim.Close() // fails what is queued, waits for calls in flight
		_ = client.Close()
	}
	return failover, "redis", closeAll, nil
}

// redisLogger adapts slog to go-redis' logger interface.
type redisLogger struct{ log *slog.Logger }

// Printf logs one go-redis message at debug level: connection problems it
// reports are already visible as failed calls, fallback and metrics.
func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.Debug("go-redis: " + fmt.Sprintf(format, v...))
}

// trustCA makes a rediss:// connection verify Redis' certificate against
// the PEM bundle in file instead of the system roots.
func trustCA(opts *goredis.UniversalOptions, file string) error {
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
