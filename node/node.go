package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-rls/sluice/backend/memory"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/ruleset"
	"github.com/sluice-rls/sluice/service"
	"github.com/sluice-rls/sluice/tracing"
	"github.com/sluice-rls/sluice/xds"
)

// healthServiceName is the grpc.health.v1 service name envoyproxy/ratelimit
// reports, so that health checks written for it keep working.
const healthServiceName = "ratelimit"

// Node is one sluice node: built by New from its Options, served by Run.
type Node struct {
	opts  Options
	log   *slog.Logger
	ready chan struct{} // closed when the listeners serve; addrs set before
	addrs Addrs
}

// Addrs are the addresses a node listens on: what its listen options
// (host:port or unix:path, port 0 included) became.
type Addrs struct {
	GRPC, HTTP net.Addr
	Admin      net.Addr // nil: no admin listener
}

// Ready is closed once Run serves on its listeners: Addrs is valid from
// then on. It is never closed when Run fails before.
func (n *Node) Ready() <-chan struct{} { return n.ready }

// Addrs returns the listeners' addresses, once Ready is closed.
func (n *Node) Addrs() Addrs {
	<-n.ready
	return n.addrs
}

// New checks opts and returns the node they describe; Run serves it.
func New(opts Options) (*Node, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Node{opts: opts, log: log, ready: make(chan struct{})}, nil
}

// Run serves the node until ctx is done, then drains (health
// NOT_SERVING, in-flight calls finish within DrainTimeout) and returns
// nil; an error if the node cannot start or a listener fails. Run a node
// once.
func (n *Node) Run(ctx context.Context) error {
	st, log := n.opts, n.log
	if embeddedRules(st) {
		// README's first command; a deployment without --config is a mistake
		// (refused in Kubernetes unless --example-rules): say so loudly, and
		// in ratelimit_config_embedded.
		log.Warn("no --config: serving the embedded EXAMPLE rules, which limit traffic by rules written for the README, not for this deployment; give --config", "rules", ruleset.DefaultRulesName)
	}
	rules, err := initialRules(st)
	if err != nil {
		return fmt.Errorf("loading rules: %w", err)
	}
	ruleset.LogWarnings(log, rules)
	store := ruleset.NewStore(rules)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerBuildInfo(reg, st.Build)
	registerEmbeddedRules(reg, embeddedRules(st))
	reloadMetrics := ruleset.NewReloadMetrics(reg)
	trail := newAuditTrail(st, log, reg)
	var xsrc *xds.Source // nil: rules from files
	if st.XDS.Server != "" {
		var stopXDS func()
		xsrc, stopXDS, err = startXDS(ctx, st, store, log, reg, reloadMetrics, trail)
		if err != nil {
			return err
		}
		defer stopXDS()
	} else {
		reloadMetrics.Loaded(true, time.Now())
	}
	reloader := &ruleset.Reloader{
		Path:     st.Config,
		Options:  st.Rules.descriptorOptions(),
		MaxBytes: st.MaxRuleBytes,
		Store:    store,
		Log:      log,
		Metrics:  reloadMetrics,
		Audit:    trail.rec,
		Node:     trail.node,
	}
	// Registered before serving, so an early SIGHUP reloads instead of
	// terminating the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if xsrc == nil { // with xDS, SIGHUP does nothing
		go reloadOn(ctx, hup, reloader)
	}
	if st.Config != "" {
		go func() {
			if err := reloader.Watch(ctx); err != nil {
				log.Error("rule files are not watched; reload with SIGHUP", "err", err)
			}
		}()
	}

	local := memory.New(memory.Options{MaxBuckets: st.MaxBuckets})
	go local.Run(ctx, memory.DefaultEvictEvery)
	registerBucketGauge(reg, "local", local.Len)
	registerFullRefusals(reg, "local", local.FullRefusals)
	traces, err := tracing.New(ctx, tracing.Options{
		Endpoint: st.TracingEndpoint, Protocol: st.TracingProtocol, Insecure: st.TracingInsecure, SampleRatio: st.TracingSampleRatio, Version: st.Build.Version, Logger: log,
	})
	if err != nil {
		return err
	}
	defer shutdownTracing(traces, st.DrainTimeout, log) // on early returns; a no-op after the drain's
	if traces != nil {
		log.Info("tracing on", "endpoint", st.TracingEndpoint, "protocol", st.TracingProtocol, "sample_ratio", st.TracingSampleRatio, "insecure", st.TracingInsecure)
	}
	global, err := newGlobal(ctx, st, log, reg, traces.Tracer())
	if err != nil {
		return err
	}
	defer global.close()
	defer trail.startStream(global.redis)() // stopped before the client closes
	var localLayer bucket.Limiter = local
	if global.sw != nil {
		localLayer = global.sw.GuardLocal(local) // --redis-failure allow bypasses it
	}

	secrets, err := startEmergency(ctx, st.Emergency, log, reg)
	if err != nil {
		return err
	}
	ovr, stopOverrides, err := startOverrides(ctx, st, global.redisOpts, store, trail, log, reg)
	if err != nil {
		return err
	}
	defer stopOverrides()

	srv := service.New(service.Options{
		Rules:            store,
		Overrides:        ovr.mgr,
		Local:            localLayer,
		Global:           global.limiter,
		Logger:           log,
		Metrics:          service.NewMetrics(reg),
		GrayKey:          st.GrayKey,
		EmergencyKey:     st.Emergency.Key,
		Emergency:        secrets,
		Shadow:           st.Shadow,
		QuotaMode:        st.QuotaMode,
		ResponseMetadata: st.ResponseMetadata,
		RateLimitHeaders: st.RateLimitHeaders,
		HeaderLimit:      st.HeaderLimit,
		HeaderRemaining:  st.HeaderRemaining,
		HeaderReset:      st.HeaderReset,
		NoRefusalDetails: !st.RefusalDetails,
		RefusalLogEvery:  st.LogRefusals,
		TopRefused:       st.TopRefused,
		MaxDescriptors:   st.MaxDescriptors,
		MaxEntries:       st.MaxEntries,
		MaxValueBytes:    st.MaxValueBytes,
		MaxMetricValues:  st.MaxMetricValues,
		Tracer:           traces.Tracer(), // nil when off: no tracing cost
	})

	serverTLS, err := newServerTLS(st, clockwork.NewRealClock(), log, reg)
	if err != nil {
		return err
	}
	adminTLS, err := newAdminTLS(st, serverTLS, clockwork.NewRealClock(), log, reg)
	if err != nil {
		return err
	}
	// Stream workers are reused goroutines whose stacks have already grown
	// to what a decision with a Redis call needs; a fresh goroutine per
	// call spent ~9% of the CPU growing its stack (profiled under load).
	// srv.Codec decodes values that are not UTF-8 instead of refusing them.
	conns := newGRPCConns(st.GRPCMaxConns, st.GRPCFirstCallTimeout, reg)
	grpcOpts := []grpc.ServerOption{conns.serverOption(transportCredentials(serverTLS)), grpc.NumStreamWorkers(streamWorkers()), grpc.ForceServerCodecV2(srv.Codec())}
	grpcOpts = append(grpcOpts, grpcConnLimits(st)...)
	if traces != nil {
		// Envoy's trace context read from the call's header, not from a copy.
		grpcOpts = append(grpcOpts, grpc.InTapHandle(srv.TapHandle))
	}
	grpcServer := grpc.NewServer(grpcOpts...)
	rlsv3.RegisterRateLimitServiceServer(grpcServer, srv)
	healthServer := health.NewServer()
	// The overall status ("") and, as envoyproxy/ratelimit reports it, the
	// service "ratelimit"; Shutdown turns both NOT_SERVING at the drain.
	healthServer.SetServingStatus(healthServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(grpcServer, healthServer)
	if xsrc != nil {
		gateHealth(ctx, healthServer, xsrc)
	}

	grpcLis, err := Listen(st.GRPCAddr)
	if err != nil {
		return fmt.Errorf("gRPC listener: %w", err)
	}
	httpLis, err := Listen(st.HTTPAddr)
	if err != nil {
		grpcLis.Close()
		return fmt.Errorf("HTTP listener: %w", err)
	}
	var adminLis net.Listener
	adminAddr := "off"
	if st.AdminAddr != "" {
		adminLis, err = Listen(st.AdminAddr)
		if err != nil {
			grpcLis.Close()
			httpLis.Close()
			return fmt.Errorf("admin listener: %w", err)
		}
		adminAddr = adminLis.Addr().String()
		if st.TLSClientCA != "" && st.AdminTLSClientCA == "" && !isLoopback(adminLis.Addr()) {
			adminLis.Close()
			grpcLis.Close()
			httpLis.Close()
			grpcServer.Stop() // its stream workers
			return fmt.Errorf("admin listener %s: %w", adminAddr, errAdminNeedsOwnCA)
		}
	}
	var draining atomic.Bool
	httpServer := newHTTPServer(newHTTPMux(global.state, store, reg, &draining, st.AdminAddr, xsrc, st.XDS.Server, ovr), st, log)

	errc := make(chan error, 3)
	go func() { errc <- grpcServer.Serve(conns.listener(grpcLis)) }()
	go func() { errc <- httpServer.Serve(limitConns(httpLis, st.HTTPMaxConns)) }()
	var adminServer *http.Server
	if adminLis != nil {
		adminMux := newAdminMux(srv, st)
		ovr.mount(adminMux)
		adminServer = newHTTPServer(adminMux, st, log)
		adminLis = limitConns(adminLis, st.HTTPMaxConns)
		if adminTLS != nil {
			adminServer.TLSConfig = adminTLS.config("h2", "http/1.1")
			go func() { errc <- adminServer.ServeTLS(adminLis, "", "") }()
		} else {
			go func() { errc <- adminServer.Serve(adminLis) }()
		}
		if !isLoopback(adminLis.Addr()) && st.AdminTLSClientCA == "" {
			log.Warn("the admin address is reachable from the network without client certificates: anyone who reaches it can spend tokens through /json",
				"admin_addr", adminAddr)
		}
		if st.TLSClientCA != "" && st.AdminTLSClientCA == "" {
			log.Warn("the admin address (loopback) asks no client certificate: --tls-client-ca verifies Envoy on the gRPC port only; give --admin-tls-client-ca for operators' certificates",
				"admin_addr", adminAddr)
		}
	}
	n.addrs = Addrs{GRPC: grpcLis.Addr(), HTTP: httpLis.Addr()}
	if adminLis != nil {
		n.addrs.Admin = adminLis.Addr()
	}
	close(n.ready)
	log.Info("serving",
		"grpc_addr", grpcLis.Addr().String(),
		"http_addr", httpLis.Addr().String(),
		"admin_addr", adminAddr,
		"backend", global.backend(),
		"rules", rulesName(st),
		"rule_count", rules.Len(),
		"version", st.Build.Version)

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	log.Info("shutting down: health NOT_SERVING, draining in-flight calls", "timeout", st.DrainTimeout)
	draining.Store(true)
	healthServer.Shutdown()
	stopGRPC(grpcServer, st.DrainTimeout)
	shutdownCtx, cancelShutdown := context.WithTimeout(context.Background(), st.DrainTimeout)
	defer cancelShutdown()
	_ = httpServer.Shutdown(shutdownCtx)
	if adminServer != nil {
		_ = adminServer.Shutdown(shutdownCtx)
	}
	shutdownTracing(traces, st.DrainTimeout, log) // flush the drained calls' spans
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) && !errors.Is(serveErr, grpc.ErrServerStopped) {
		return fmt.Errorf("serving: %w", serveErr)
	}
	log.Info("stopped")
	return nil
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
