package node

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/sluice-rls/sluice/service"
	"github.com/sluice-rls/sluice/tracing"
)

// servers are a node's servers: gRPC, the public HTTP mux, the admin mux
// and the metrics listener's.
type servers struct {
	grpc     *grpcServer
	http     *http.Server
	admin    *http.Server // nil without --admin-addr; TLSConfig set with --tls-cert
	metrics  *http.Server // nil without --metrics-addr
	draining *atomic.Bool // /healthcheck answers 503 once set
}

// newServers builds the servers of svc, reading the TLS files of
// --tls-cert (certificates are reloaded as they change).
func (n *Node) newServers(ctx context.Context, reg *prometheus.Registry, svc *service.Server, rules ruleSource, global globalLayer, ovr *overrides, traced bool) (servers, error) {
	st, log := n.opts, n.log
	serverTLS, err := newServerTLS(st, clockwork.NewRealClock(), log, reg)
	if err != nil {
		return servers{}, err
	}
	adminTLS, err := newAdminTLS(st, serverTLS, clockwork.NewRealClock(), log, reg)
	if err != nil {
		return servers{}, err
	}
	s := servers{
		grpc:     newGRPCServer(ctx, st, svc, serverTLS, traced, rules.xds, reg),
		draining: new(atomic.Bool),
	}
	s.http = newHTTPServer(newHTTPMux(global.state, rules.store, reg, s.draining, st.AdminAddr, rules.xds, st.XDS, ovr), st, log)
	if st.MetricsAddr != "" {
		s.metrics = newHTTPServer(newMetricsMux(reg, st.MetricsPath), st, log)
	}
	if st.AdminAddr != "" {
		mux := newAdminMux(svc, st)
		ovr.mount(mux)
		s.admin = newHTTPServer(mux, st, log)
		if adminTLS != nil {
			s.admin.TLSConfig = adminTLS.config("h2", "http/1.1")
		}
	}
	return s, nil
}

// serve serves s on lis until ctx is done or a server fails, then
// drains: health NOT_SERVING, calls in flight finish within
// --drain-timeout, and the spans of the drained calls are flushed.
func (n *Node) serve(ctx context.Context, s servers, lis listeners, rules ruleSource, global globalLayer, traces *tracing.Provider) error {
	st, log := n.opts, n.log
	errc := make(chan error, 4)
	go func() { errc <- s.grpc.serve(lis.grpc) }()
	go func() { errc <- s.http.Serve(limitConns(lis.http, st.HTTPMaxConns)) }()
	metricsAddr := "off"
	if s.metrics != nil {
		metricsAddr = lis.metrics.Addr().String()
		go func() { errc <- s.metrics.Serve(limitConns(lis.metrics, st.HTTPMaxConns)) }()
	}
	adminAddr := "off"
	if s.admin != nil {
		adminAddr = lis.admin.Addr().String()
		adminLis := limitConns(lis.admin, st.HTTPMaxConns)
		if s.admin.TLSConfig != nil {
			go func() { errc <- s.admin.ServeTLS(adminLis, "", "") }()
		} else {
			go func() { errc <- s.admin.Serve(adminLis) }()
		}
	}
	n.addrs = lis.addrs()
	close(n.ready)
	log.Info("serving",
		"grpc_addr", lis.grpc.Addr().String(),
		"http_addr", lis.http.Addr().String(),
		"admin_addr", adminAddr,
		"metrics_addr", metricsAddr,
		"backend", global.backend(),
		"rules", rulesName(st),
		"rule_count", rules.initial,
		"version", st.Build.Version)

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	log.Info("shutting down: health NOT_SERVING, draining in-flight calls", "timeout", st.DrainTimeout)
	s.drain(st.DrainTimeout)
	shutdownTracing(traces, st.DrainTimeout, log) // flush the drained calls' spans
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) && !errors.Is(serveErr, grpc.ErrServerStopped) {
		return fmt.Errorf("serving: %w", serveErr)
	}
	log.Info("stopped")
	return nil
}
