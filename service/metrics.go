package service

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rls/sluice/descriptors"
)

// Result label values of ratelimit_decisions_total.
const (
	resultOK        = "ok"
	resultOverLimit = "over_limit"
	resultNearLimit = "near_limit"
	resultShadow    = "shadow_mode"
)

// Indexes into layers and results.
const (
	layerLocal = iota
	layerGlobal
	layerFallback
)

const (
	resOK = iota
	resOverLimit
	resNearLimit
	resShadow
)

// Indexes into malformedKinds: request parts decided despite a problem.
const (
	malformedLongValue = iota
	malformedOverride
	malformedUTF8
)

// malformedKinds are the kind label values of ratelimit_malformed_parts_total.
var malformedKinds = [...]string{"long_value", "bad_override", "invalid_utf8"}

// overrideRule is the rule label of descriptors limited only by Envoy's
// per-descriptor limit override.
const overrideRule = "_override"

// Metrics are the request-path Prometheus metrics of DESIGN.md. A nil
// *Metrics records nothing. Build it with NewMetrics on a registry the caller
// owns.
type Metrics struct {
	requests       *prometheus.CounterVec
	decisions      *prometheus.CounterVec
	duration       prometheus.Histogram
	unknownDomains prometheus.Counter
	invalid        prometheus.Counter
	globalErrors   prometheus.Counter
	malformedParts [len(malformedKinds)]prometheus.Counter

	// WithLabelValues allocates and hashes on every call, so the hot path
	// uses counters cached per domain and per rule of the current rule set.
	okReqs sync.Map // domain string → *[2]prometheus.Counter
	rules  atomic.Pointer[ruleCounters]
}

// ruleCounters caches decision counters for the rules of one rule set; a
// reload starts a new cache, so old rules are not kept alive.
type ruleCounters struct {
	cfg *descriptors.Config
	m   sync.Map // *descriptors.Rule → *decisionCounters
}

// decisionCounters are one rule's counters by layer and result.
type decisionCounters [len(layers)][len(results)]prometheus.Counter

var (
	layers  = [...]string{LayerLocal, LayerGlobal, LayerFallback}
	results = [...]string{resultOK, resultOverLimit, resultNearLimit, resultShadow}
)

// NewMetrics creates the request-path metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_requests_total",
			Help: "ShouldRateLimit requests answered, by domain and overall code.",
		}, []string{"domain", "code"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_decisions_total",
			Help: "Per-descriptor decisions, by domain, rule path, deciding layer and result.",
		}, []string{"domain", "rule", "layer", "result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ratelimit_request_duration_seconds",
			Help:    "Time to decide a ShouldRateLimit request.",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .02, .05},
		}),
		unknownDomains: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_unknown_domain_requests_total",
			Help: "Requests for a domain no rule file defines (answered OK).",
		}),
		invalid: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_invalid_requests_total",
			Help: "Requests refused with InvalidArgument (malformed or oversized).",
		}),
		globalErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_global_errors_total",
			Help: "Global-layer calls that failed with no fallback to answer; the local layer decided.",
		}),
	}
	malformed := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_malformed_parts_total",
		Help: "Malformed request parts decided without refusing the request, by kind: long_value (limited by a digest of the value), bad_override (Envoy's limit override ignored, the rule decides), invalid_utf8 (invalid bytes escaped).",
	}, []string{"kind"})
	for i, k := range malformedKinds {
		m.malformedParts[i] = malformed.WithLabelValues(k)
	}
	reg.MustRegister(m.requests, m.decisions, m.duration, m.unknownDomains, m.invalid, m.globalErrors, malformed)
	return m
}

func (m *Metrics) request(domain string, ok bool) {
	if m == nil {
		return
	}
	v, found := m.okReqs.Load(domain)
	if !found {
		v, _ = m.okReqs.LoadOrStore(domain, &[2]prometheus.Counter{
			m.requests.WithLabelValues(domain, "over_limit"),
			m.requests.WithLabelValues(domain, "ok"),
		})
	}
	c := v.(*[2]prometheus.Counter)
	if ok {
		c[1].Inc()
	} else {
		c[0].Inc()
	}
}

func (m *Metrics) decision(cfg *descriptors.Config, domain string, r *descriptors.Rule, entries []descriptors.Entry, layer, result int) {
	if m == nil {
		return
	}
	if r == nil {
		m.decisions.WithLabelValues(domain, overrideRule, layers[layer], results[result]).Inc()
		return
	}
	if label := r.MetricLabel(entries); label != r.Path {
		// detailed_metric or value_to_metric: labels carry request values.
		m.decisions.WithLabelValues(domain, label, layers[layer], results[result]).Inc()
		return
	}
	m.ruleCounters(cfg, r)[layer][result].Inc()
}

// ruleCounters returns r's cached counters, creating them on first use.
func (m *Metrics) ruleCounters(cfg *descriptors.Config, r *descriptors.Rule) *decisionCounters {
	rc := m.rules.Load()
	if rc == nil || rc.cfg != cfg {
		fresh := &ruleCounters{cfg: cfg}
		if m.rules.CompareAndSwap(rc, fresh) {
			rc = fresh
		} else {
			rc = m.rules.Load()
		}
	}
	if v, ok := rc.m.Load(r); ok {
		return v.(*decisionCounters)
	}
	dc := new(decisionCounters)
	for l := range layers {
		for res := range results {
			dc[l][res] = m.decisions.WithLabelValues(r.Domain, r.Path, layers[l], results[res])
		}
	}
	v, _ := rc.m.LoadOrStore(r, dc)
	return v.(*decisionCounters)
}

func (m *Metrics) observeDuration(d time.Duration) {
	if m != nil {
		m.duration.Observe(d.Seconds())
	}
}

func (m *Metrics) unknownDomain() {
	if m != nil {
		m.unknownDomains.Inc()
	}
}

func (m *Metrics) invalidRequest() {
	if m != nil {
		m.invalid.Inc()
	}
}

func (m *Metrics) malformed(kind int) {
	if m != nil {
		m.malformedParts[kind].Inc()
	}
}

func (m *Metrics) globalError() {
	if m != nil {
		m.globalErrors.Inc()
	}
}
