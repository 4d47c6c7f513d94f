package main

import (
	"github.com/prometheus/client_golang/prometheus"
)

// registerBucketGauge exports ratelimit_memory_buckets{backend=name} for a
// memory backend, read at scrape time.
func registerBucketGauge(reg prometheus.Registerer, name string, count func() int) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "ratelimit_memory_buckets",
		Help:        "Buckets held in memory (partly drained ones; full buckets are dropped), by backend.",
		ConstLabels: prometheus.Labels{"backend": name},
	}, func() float64 { return float64(count()) }))
}
