package adaptive

import "github.com/prometheus/client_golang/prometheus"

// metrics are the controller's Prometheus series.
type metrics struct {
	scale, triggered, signal *prometheus.GaugeVec
	triggers, signalErrors   *prometheus.CounterVec
	actor, dryRun            prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		scale: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ratelimit_adaptive_scale",
			Help: "Scale an adaptive policy applies to its scope (domain, and rule unless domain-wide) (1: the rule files' limits); in dry run, the scale it would apply.",
		}, []string{"policy", "domain", "rule"}),
		triggered: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ratelimit_adaptive_triggered",
			Help: "1 while an adaptive policy's scale is below 1 (it tightens its scope's limits), else 0.",
		}, []string{"policy"}),
		signal: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ratelimit_adaptive_signal",
			Help: "Last value of an adaptive policy's signal, as read by the acting node (NaN when the last read failed).",
		}, []string{"policy", "signal"}),
		triggers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_adaptive_triggers_total",
			Help: "Times an adaptive policy lowered its scale below 1, counted by the acting node.",
		}, []string{"policy"}),
		signalErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_adaptive_signal_errors_total",
			Help: "Reads of an adaptive policy's signal that gave no number (Prometheus unreachable, an empty result, several series, NaN).",
		}, []string{"policy", "signal"}),
		actor: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_adaptive_actor",
			Help: "1 while this node is the one that evaluates the adaptive policies and writes their scale.",
		}),
		dryRun: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_adaptive_dry_run",
			Help: "1 when the adaptive policies run dry: logged and exported, never written.",
		}),
	}
	reg.MustRegister(m.scale, m.triggered, m.signal, m.triggers, m.signalErrors, m.actor, m.dryRun)
	return m
}
