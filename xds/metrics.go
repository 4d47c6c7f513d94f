package xds

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the xDS source's own metrics; rule loads are counted by
// ruleset.ReloadMetrics. Build with NewMetrics; nil records nothing.
type Metrics struct {
	info      *prometheus.GaugeVec
	connected prometheus.Gauge
}

// NewMetrics creates ratelimit_config_info and ratelimit_xds_connected on
// reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ratelimit_config_info",
			Help: "1 for the rules in use: where they came from (source) and their version (the xDS version_info).",
		}, []string{"source", "version"}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_xds_connected",
			Help: "1 while the stream to the xDS management server is open, 0 while reconnecting.",
		}),
	}
	reg.MustRegister(m.info, m.connected)
	return m
}

func (m *Metrics) setVersion(v string) {
	if m == nil {
		return
	}
	m.info.Reset()
	m.info.WithLabelValues("xds", v).Set(1)
}

func (m *Metrics) setConnected(up bool) {
	if m == nil {
		return
	}
	if up {
		m.connected.Set(1)
	} else {
		m.connected.Set(0)
	}
}
