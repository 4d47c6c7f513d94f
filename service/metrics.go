package service

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rls/sluice/descriptors"
)

// result is a descriptor's result; its String is the result label of
// ratelimit_decisions_total.
type result uint8

const (
	resultOK result = iota
	resultOverLimit
	resultNearLimit
	resultShadow
	numResults
)

// String returns the result label value.
func (r result) String() string {
	switch r {
	case resultOverLimit:
		return "over_limit"
	case resultNearLimit:
		return "near_limit"
	case resultShadow:
		return "shadow_mode"
	}
	return "ok"
}

// grayLabels are the gray label values of ratelimit_decisions_total, by
// whether the request was gray: two values, built once, so the label
// costs no allocation per request.
var grayLabels = [2]string{"false", "true"}

// grayIndex is the index of a request's gray label in grayLabels and
// decisionCounters.
func grayIndex(gray bool) int {
	if gray {
		return 1
	}
	return 0
}

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

// Metrics are the request-path Prometheus metrics of docs/metrics.md. A nil
// *Metrics records nothing. Build it with NewMetrics on a registry the caller
// owns.
type Metrics struct {
	requests       *domainPair // ratelimit_requests_total: over_limit, ok
	decisions      *prometheus.CounterVec
	duration       prometheus.Histogram
	unknownDomains prometheus.Counter
	invalid        prometheus.Counter
	globalErrors   prometheus.Counter
	malformedParts [len(malformedKinds)]prometheus.Counter

	// WithLabelValues allocates and hashes on every call, so the hot path
	// uses counters cached per domain and per rule of the current rule set.
	rules atomic.Pointer[ruleCounters]

	values valueLabels

	tenants *tenantUse // rules with utilisation (tenants.go)

	emergencyReqs *domainPair // ratelimit_emergency_requests_total: rejected, allowed (emergency.go)
}

// DefaultMaxMetricValues is the default cap on rule labels that carry
// request values (Options.MaxMetricValues).
const DefaultMaxMetricValues = 1000

// overflowSuffix ends the rule label that counts, for a rule with
// detailed_metric or value_to_metric, the values beyond the cap. A label
// built from values always has '_' or '.' after the rule's key, so
// "<rule path>:overflow" names no value.
const overflowSuffix = ":overflow"

// valueLabels tracks the rule labels that carry request values, so that
// they stay bounded and go with their rule.
type valueLabels struct {
	mu     sync.Mutex
	max    int
	n      int
	byRule map[ruleID]map[string]struct{}
}

// ruleID names a rule across reloads.
type ruleID struct{ domain, path string }

// admit returns label if it is tracked or fits under the cap, else the
// rule's overflow label.
func (v *valueLabels) admit(r *descriptors.Rule, label string) string {
	id := ruleID{r.Domain, r.Path}
	v.mu.Lock()
	defer v.mu.Unlock()
	set := v.byRule[id]
	if _, ok := set[label]; ok {
		return label
	}
	if v.n >= v.max {
		return r.Path + overflowSuffix
	}
	if set == nil {
		if v.byRule == nil {
			v.byRule = make(map[ruleID]map[string]struct{})
		}
		set = make(map[string]struct{})
		v.byRule[id] = set
	}
	set[label] = struct{}{}
	v.n++
	return label
}

// forget stops tracking the labels of rule id and returns them.
func (v *valueLabels) forget(id ruleID) map[string]struct{} {
	v.mu.Lock()
	defer v.mu.Unlock()
	set := v.byRule[id]
	v.n -= len(set)
	delete(v.byRule, id)
	return set
}

// ruleCounters caches decision counters for the rules of one rule set; a
// reload starts a new cache, so old rules are not kept alive.
type ruleCounters struct {
	cfg *descriptors.Config
	m   sync.Map // *descriptors.Rule → *decisionCounters
}

// decisionCounters are one rule's counters by gray (grayIndex), deciding
// layer and result. Only those a decision of the rule is likely to need
// are created with the rule (zero-valued series, so that rate() sees the
// first decision): gray false, the layers the rule has a limit in, results
// ok, over_limit and near_limit, and shadow_mode for a shadow rule. The
// others (gray true, the fallback layer, shadow_mode from --shadow or an
// override, a layer an override adds) are created by their first decision:
// 24 series a rule would otherwise cost, 3 to 8 are made.
type decisionCounters struct {
	domain, path string
	c            [len(grayLabels)][LayerNone][numResults]atomic.Pointer[lazyCounter]
}

// lazyCounter holds a counter of decisionCounters once it exists.
type lazyCounter struct{ prometheus.Counter }

// counter returns the counter of gray index g, layer l and result res,
// creating its series on first use.
func (dc *decisionCounters) counter(vec *prometheus.CounterVec, g int, l Layer, res result) prometheus.Counter {
	p := &dc.c[g][l][res]
	if c := p.Load(); c != nil {
		return c.Counter
	}
	c := &lazyCounter{vec.WithLabelValues(dc.domain, dc.path, l.String(), res.String(), grayLabels[g])}
	p.CompareAndSwap(nil, c) // another caller's is the same series
	return c.Counter
}

// NewMetrics creates the request-path metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: newDomainPair(prometheus.CounterOpts{
			Name: "ratelimit_requests_total",
			Help: "ShouldRateLimit requests answered, by domain and overall code.",
		}, "code", "over_limit", "ok"),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_decisions_total",
			Help: "Per-descriptor decisions, by domain, rule path, deciding layer, result and whether the request was gray.",
		}, []string{"domain", "rule", "layer", "result", "gray"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "ratelimit_request_duration_seconds",
			Help:    "Time to decide a ShouldRateLimit request.",
			Buckets: []float64{.000005, .00001, .000025, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .02, .05},
		}),
		unknownDomains: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_unknown_domain_requests_total",
			Help: "Requests for a domain no rule file defines (answered OK).",
		}),
		invalid: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_invalid_requests_total",
			Help: "Requests refused with InvalidArgument (malformed or oversized).",
		}),
		tenants: newTenantUse(),
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
	m.emergencyReqs = newDomainPair(prometheus.CounterOpts{
		Name: "ratelimit_emergency_requests_total",
		Help: "Requests carrying the emergency entry (--emergency-key), by domain and result: allowed (an accepted secret: let through whatever the limits) or rejected (a wrong secret: decided as any other request).",
	}, "result", "rejected", "allowed")
	reg.MustRegister(m.requests.vec, m.decisions, m.duration, m.unknownDomains, m.invalid, m.globalErrors, malformed, m.emergencyReqs.vec, m.tenants.consumed, m.tenants.quota)
	return m
}

func (m *Metrics) request(domain string, ok bool) {
	if m == nil {
		return
	}
	m.requests.inc(domain, ok)
}

// domainPair is a counter vector labelled by domain and by a second label
// of two values, with each domain's two counters cached: WithLabelValues
// allocates and hashes on every call, a cached pair costs one map load.
type domainPair struct {
	vec      *prometheus.CounterVec
	no, yes  string   // the second label's values
	byDomain sync.Map // domain string → *[2]prometheus.Counter: no, yes
}

func newDomainPair(opts prometheus.CounterOpts, label, no, yes string) *domainPair {
	return &domainPair{vec: prometheus.NewCounterVec(opts, []string{"domain", label}), no: no, yes: yes}
}

// inc counts one under domain and yes or no.
func (p *domainPair) inc(domain string, yes bool) {
	v, found := p.byDomain.Load(domain)
	if !found {
		v, _ = p.byDomain.LoadOrStore(domain, &[2]prometheus.Counter{
			p.vec.WithLabelValues(domain, p.no),
			p.vec.WithLabelValues(domain, p.yes),
		})
	}
	c := v.(*[2]prometheus.Counter)
	if yes {
		c[1].Inc()
	} else {
		c[0].Inc()
	}
}

// forget deletes a removed domain's series.
func (p *domainPair) forget(domain string) {
	p.vec.DeletePartialMatch(prometheus.Labels{"domain": domain})
	p.byDomain.Delete(domain)
}

func (m *Metrics) decision(cfg *descriptors.Config, domain string, r *descriptors.Rule, entries []descriptors.Entry, layer Layer, res result, gray bool) {
	if m == nil {
		return
	}
	g := grayIndex(gray)
	if r == nil {
		m.decisions.WithLabelValues(domain, overrideRule, layer.String(), res.String(), grayLabels[g]).Inc()
		return
	}
	if label := r.MetricLabel(entries); label != r.Path {
		// detailed_metric or value_to_metric: labels carry request values.
		label = m.values.admit(r, label)
		m.decisions.WithLabelValues(domain, label, layer.String(), res.String(), grayLabels[g]).Inc()
		return
	}
	m.ruleCounters(cfg, r).counter(m.decisions, g, layer, res).Inc()
}

// useRules notes the rule set a request is decided with. The first request
// after a reload starts a new counter cache and deletes the series of the
// rules and domains the reload removed, so they neither linger in /metrics
// nor grow without bound across reloads. (A request still deciding on the
// old rules may recreate one; it then stays until the next reload.)
func (m *Metrics) useRules(cfg *descriptors.Config) {
	if m == nil {
		return
	}
	rc := m.rules.Load()
	if rc != nil && rc.cfg == cfg {
		return
	}
	if m.rules.CompareAndSwap(rc, &ruleCounters{cfg: cfg}) && rc != nil {
		m.deleteRemoved(rc.cfg, cfg)
	}
}

// deleteRemoved deletes the series of the rules and domains of old that cur
// does not have, and the utilisation series of the rules cur has without
// utilisation.
func (m *Metrics) deleteRemoved(old, cur *descriptors.Config) {
	kept := make(map[ruleID]bool)
	for _, r := range cur.Rules() {
		kept[ruleID{r.Domain, r.Path}] = true
		if !r.Utilisation {
			m.tenants.forget(ruleID{r.Domain, r.Path}) // opted out: its series go
		}
	}
	for _, r := range old.Rules() {
		id := ruleID{r.Domain, r.Path}
		if kept[id] {
			continue
		}
		m.decisions.DeletePartialMatch(prometheus.Labels{"domain": r.Domain, "rule": r.Path})
		m.decisions.DeletePartialMatch(prometheus.Labels{"domain": r.Domain, "rule": r.Path + overflowSuffix})
		m.tenants.forget(id)
		for label := range m.values.forget(id) {
			m.decisions.DeletePartialMatch(prometheus.Labels{"domain": r.Domain, "rule": label})
		}
	}
	for _, d := range old.Domains() {
		if cur.Domain(d) == nil {
			m.requests.forget(d)
			m.decisions.DeletePartialMatch(prometheus.Labels{"domain": d})
			m.emergencyReqs.forget(d)
		}
	}
}

// ruleCounters returns r's cached counters, creating them on first use.
func (m *Metrics) ruleCounters(cfg *descriptors.Config, r *descriptors.Rule) *decisionCounters {
	m.useRules(cfg)
	rc := m.rules.Load()
	if v, ok := rc.m.Load(r); ok {
		return v.(*decisionCounters)
	}
	dc := &decisionCounters{domain: r.Domain, path: r.Path}
	for _, l := range [...]struct {
		layer Layer
		has   bool
	}{{LayerLocal, r.Local != nil}, {LayerGlobal, r.Global != nil}} {
		if !l.has {
			continue
		}
		for _, res := range [...]result{resultOK, resultOverLimit, resultNearLimit} {
			dc.counter(m.decisions, 0, l.layer, res)
		}
		if r.ShadowMode {
			dc.counter(m.decisions, 0, l.layer, resultShadow)
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

func (m *Metrics) capValues(n int) {
	if m != nil {
		m.values.mu.Lock()
		m.values.max = n
		m.values.mu.Unlock()
	}
}

func (m *Metrics) capTenants(n int) {
	if m != nil {
		m.tenants.mu.Lock()
		m.tenants.max = n
		m.tenants.mu.Unlock()
	}
}

// tenantTokens counts the tokens of a decided descriptor of a rule with
// utilisation under its tenant: its cost when the chosen layer allowed it
// and it took tokens (not is_negative_hits), else 0 (the series and the
// rule's quota still show).
func (m *Metrics) tenantTokens(r *descriptors.Rule, entries []descriptors.Entry, c chosen) {
	if m == nil {
		return
	}
	var cost uint64
	if c.state.Allowed && !c.hit.Give {
		cost = c.hit.Cost
	}
	m.tenants.add(r, r.Tenant(entries), cost)
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
