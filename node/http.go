package node

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/net/netutil"

	"github.com/sluice-rls/sluice/ruleset"
	"github.com/sluice-rls/sluice/service"
	"github.com/sluice-rls/sluice/xds"
)

// newHTTPMux serves the HTTP address (--http-addr): /healthcheck, /metrics
// and /rlconfig, which spend no tokens, for kubelet probes and Prometheus.
// /json, /usage and /usage/top answer 404 saying where they are served.
//
// /healthcheck answers 200 while serving — in fallback too, since the
// service still works; its body says which layer answers global rules —
// and 503 once SIGTERM started the drain.
//
// With --xds-server (xsrc not nil) /healthcheck answers 503 until the first
// xDS update is applied (unless --xds-ready-before-rules), and /rlconfig
// starts with the rules' version.
func newHTTPMux(globalState func() string, store *ruleset.Store, reg *prometheus.Registry, draining *atomic.Bool, adminAddr string, xsrc *xds.Source, x XDS, ovr *overrides) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthcheck", func(w http.ResponseWriter, r *http.Request) {
		if draining.Load() {
			http.Error(w, "draining", http.StatusServiceUnavailable)
			return
		}
		if why := xdsWaiting(xsrc, x); why != "" {
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "OK\nglobal layer: %s\n", globalState())
		if ovr != nil {
			fmt.Fprintln(w, ovr.healthLine())
		}
	})
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/rlconfig", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if xsrc != nil {
			v, _ := xsrc.Version()
			fmt.Fprintf(w, "# version: %s source: xds\n", v)
		}
		for _, rule := range store.Rules().Rules() {
			fmt.Fprintln(w, rule.String())
		}
		if ovr != nil {
			ovr.writeRLConfig(w)
		}
	})
	where := "on the admin address " + adminAddr + " (--admin-addr)"
	if adminAddr == "" {
		where = "on the admin address, which is off (--admin-addr is empty)"
	}
	for _, path := range []string{"/json", "/usage", "/usage/top"} {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, path+" is served "+where, http.StatusNotFound)
		})
	}
	mux.HandleFunc("/overrides", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "/overrides is served "+where+", authenticated", http.StatusNotFound)
	})
	return mux
}

// newMetricsMux serves /metrics alone, at path ("/metrics" when empty), on
// --metrics-addr: where envoyproxy/ratelimit's deployments scrape
// (PROMETHEUS_ADDR, :19001 in Envoy Gateway's).
func newMetricsMux(reg *prometheus.Registry, path string) *http.ServeMux {
	if path == "" {
		path = "/metrics"
	}
	mux := http.NewServeMux()
	mux.Handle(path, promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	return mux
}

// newAdminMux serves the admin address (--admin-addr): /json, which spends
// and (with --json-negative-hits) returns tokens; /usage and /usage/top,
// which read buckets and the values refused most (values may be personal
// data); and, when enabled, /debug/pprof/.
func newAdminMux(srv *service.Server, st Options) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/json", srv.JSONHandler(service.JSONOptions{AllowNegativeHits: st.JSONNegativeHits}))
	mux.Handle("/usage", srv.UsageHandler())
	mux.Handle("/usage/top", srv.TopRefusedHandler())
	if st.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		// Not pprof.Cmdline: the command line may hold secrets, such as a
		// --redis URL with a password.
		mux.HandleFunc("/debug/pprof/cmdline", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "not served: the command line may hold secrets", http.StatusNotFound)
		})
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// newHTTPServer returns a server for the HTTP or admin listener with the
// --http-*-timeout limits, logging its errors (accept failures, TLS
// handshakes) through log.
func newHTTPServer(h http.Handler, st Options, log *slog.Logger) *http.Server {
	return &http.Server{
		ErrorLog:    slog.NewLogLogger(log.Handler(), slog.LevelWarn),
		Handler:     h,
		ReadTimeout: st.HTTPReadTimeout, // also the header timeout
		// pprof's profile and trace add their duration to it.
		WriteTimeout: st.HTTPWriteTimeout,
		IdleTimeout:  st.HTTPIdleTimeout,
	}
}

// limitConns caps the connections open at once on lis (0: no cap): the
// others wait in the kernel's accept backlog, holding no descriptor of
// this process.
func limitConns(lis net.Listener, n int) net.Listener {
	if n <= 0 {
		return lis
	}
	return netutil.LimitListener(lis, n)
}
