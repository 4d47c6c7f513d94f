package fallback

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the Redis and fallback metrics of docs/metrics.md.
type Metrics struct {
	active      prometheus.Gauge
	transitions *prometheus.CounterVec
	duration    prometheus.Observer
	errors      *prometheus.CounterVec
	stalls      *prometheus.CounterVec
}

// NewMetrics creates and registers ratelimit_fallback_active,
// ratelimit_fallback_transitions_total,
// ratelimit_fallback_stall_probes_total, ratelimit_redis_duration_seconds
// and ratelimit_redis_errors_total on reg. kinds are the primary's error
// kinds (backend/redis.ErrorKinds), created at zero.
func NewMetrics(reg prometheus.Registerer, kinds []string) *Metrics {
	m := &Metrics{
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_fallback_active",
			Help: "1 while this node answers global rules from its fallback because Redis failed.",
		}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_fallback_transitions_total",
			Help: "Switches between Redis and the fallback, by the state switched to.",
		}, []string{"to"}),
		stalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_fallback_stall_probes_total",
			Help: "Probes run because Redis calls timed out as if Redis stalled, by result: down (the probe failed too: the node switched to fallback) or up (it answered: the node stayed on Redis).",
		}, []string{"result"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_redis_errors_total",
			Help: "Failed Redis calls, by kind.",
		}, []string{"kind"}),
	}
	durations := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "ratelimit_redis_duration_seconds",
		Help:    "Time of Redis calls, by operation.",
		Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .02, .05, .1},
	}, []string{"op"})
	m.duration = durations.WithLabelValues("hit")
	for _, to := range []string{"fallback", "redis"} {
		m.transitions.WithLabelValues(to)
	}
	for _, r := range []string{"down", "up"} {
		m.stalls.WithLabelValues(r)
	}
	for _, k := range kinds {
		m.errors.WithLabelValues(k)
	}
	reg.MustRegister(m.active, m.transitions, m.stalls, m.errors, durations)
	return m
}

func (m *Metrics) observe(d time.Duration, err error, classify func(error) string) {
	if m == nil {
		return
	}
	m.duration.Observe(d.Seconds())
	if err != nil {
		m.errors.WithLabelValues(classify(err)).Inc()
	}
}

func (m *Metrics) transition(toFallback bool) {
	if m == nil {
		return
	}
	m.setActive(toFallback)
	if toFallback {
		m.transitions.WithLabelValues("fallback").Inc()
	} else {
		m.transitions.WithLabelValues("redis").Inc()
	}
}

func (m *Metrics) setActive(on bool) {
	if m == nil {
		return
	}
	if on {
		m.active.Set(1)
	} else {
		m.active.Set(0)
	}
}

// confirmed counts a probe that confirmed a suspected stall (down) or
// found Redis answering (up).
func (m *Metrics) confirmed(down bool) {
	if m == nil {
		return
	}
	if down {
		m.stalls.WithLabelValues("down").Inc()
	} else {
		m.stalls.WithLabelValues("up").Inc()
	}
}

// observeError counts err, of a call that is no decision (a probe), in
// ratelimit_redis_errors_total.
func (m *Metrics) observeError(err error, classify func(error) string) {
	if m == nil {
		return
	}
	m.errors.WithLabelValues(classify(err)).Inc()
}
