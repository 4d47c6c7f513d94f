package lease

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the lease metrics of docs/metrics.md. A nil *Metrics counts
// nothing.
type Metrics struct {
	leases        prometheus.Counter
	tokensLeased  prometheus.Counter
	returned      prometheus.Counter
	answeredLease prometheus.Counter
	waited        prometheus.Counter
}

// NewMetrics creates and registers ratelimit_lease_leases_total,
// ratelimit_lease_tokens_total and ratelimit_lease_decisions_total on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	tokens := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_lease_tokens_total",
		Help: "Tokens of leased global buckets, by direction: leased from Redis, or given back unused.",
	}, []string{"direction"})
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_lease_decisions_total",
		Help: "Decisions of the leased global layer with leased hits, by how they were answered: from the node's leases, or after waiting on Redis.",
	}, []string{"answer"})
	m := &Metrics{
		leases: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_lease_leases_total",
			Help: "Leases of global-bucket tokens taken from Redis.",
		}),
		tokensLeased:  tokens.WithLabelValues("leased"),
		returned:      tokens.WithLabelValues("returned"),
		answeredLease: decisions.WithLabelValues("lease"),
		waited:        decisions.WithLabelValues("redis"),
	}
	reg.MustRegister(m.leases, tokens, decisions)
	return m
}

func (m *Metrics) leased(n uint64) {
	if m != nil {
		m.leases.Inc()
		m.tokensLeased.Add(float64(n))
	}
}

func (m *Metrics) given(n uint64) {
	if m != nil && n > 0 {
		m.returned.Add(float64(n))
	}
}

func (m *Metrics) fromLease() {
	if m != nil {
		m.answeredLease.Inc()
	}
}

func (m *Metrics) redisCall() {
	if m != nil {
		m.waited.Inc()
	}
}
