package node

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// newRegistry returns the registry /metrics serves, holding the Go and
// process collectors, ratelimit_build_info and ratelimit_config_embedded;
// each part of the node registers its own metrics on it.
func newRegistry(st Options) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerBuildInfo(reg, st.Build)
	registerEmbeddedRules(reg, embeddedRules(st))
	return reg
}

// registerBucketGauge exports ratelimit_memory_buckets{backend=name} for a
// memory backend, read at scrape time.
func registerBucketGauge(reg prometheus.Registerer, name string, count func() int) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "ratelimit_memory_buckets",
		Help:        "Buckets held in memory (partly drained ones; full buckets are dropped), by backend.",
		ConstLabels: prometheus.Labels{"backend": name},
	}, func() float64 { return float64(count()) }))
}

// registerFullRefusals exports ratelimit_memory_full_refusals_total{backend=name}
// for a memory backend: hits refused because the backend's table was full of
// partly drained buckets (memory.Limiter.FullRefusals), read at scrape time.
func registerFullRefusals(reg prometheus.Registerer, name string, count func() uint64) {
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name:        "ratelimit_memory_full_refusals_total",
		Help:        "Hits refused as over limit because the backend's buckets were all partly drained and --max-buckets reached, by backend.",
		ConstLabels: prometheus.Labels{"backend": name},
	}, func() float64 { return float64(count()) }))
}

// registerBuildInfo exports ratelimit_build_info{version,commit,goversion},
// always 1: the build of the running binary, for joins and dashboards.
func registerBuildInfo(reg prometheus.Registerer, b Build) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ratelimit_build_info",
		Help: "Build of the running rls binary (always 1): release version, VCS commit and Go version.",
		ConstLabels: prometheus.Labels{
			"version":   b.Version,
			"commit":    b.Commit,
			"goversion": b.GoVersion,
		},
	})
	g.Set(1)
	reg.MustRegister(g)
}
