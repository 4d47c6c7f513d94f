package share

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the standing-shares metrics of docs/metrics.md. A nil
// *Metrics counts nothing.
type Metrics struct {
	byShare, behind prometheus.Counter
}

// NewMetrics creates and registers ratelimit_share_decisions_total on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_share_decisions_total",
		Help: "Global-layer decisions with a hit of a rule with a share, by who answered: share (this node's standing shares alone, no Redis call) or redis (some hit went to Redis' part).",
	}, []string{"answer"})
	reg.MustRegister(decisions)
	return &Metrics{byShare: decisions.WithLabelValues("share"), behind: decisions.WithLabelValues("redis")}
}

// RegisterNodes adds ratelimit_share_nodes to reg: the n shares are
// sized by, 0 while this node holds none, as share reports them now.
func RegisterNodes(reg prometheus.Registerer, share func() (n int, ok bool)) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ratelimit_share_nodes",
		Help: "The node count n this node's standing shares are sized by (f/n of a rule); 0 while it holds none.",
	}, func() float64 {
		if n, ok := share(); ok {
			return float64(n)
		}
		return 0
	}))
}

func (m *Metrics) decided(byShare bool) {
	switch {
	case m == nil:
	case byShare:
		m.byShare.Inc()
	default:
		m.behind.Inc()
	}
}
