package service

import (
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/descriptors"
)

// DefaultMaxTenants is the default cap on the tenants a rule with
// utilisation reports under their own label (Options.MaxTenants).
const DefaultMaxTenants = 100

// otherTenant is the tenant label of the tokens of a rule's tenants beyond
// the cap. No tenant's own label is "_other" (tenantLabel).
const otherTenant = "_other"

// tenantLabel is the tenant label of a kept tenant: its value, with one
// more "_" in front when it starts with "_" (a tenant "_other" is
// "__other"), so that labels starting with a single "_" are sluice's.
func tenantLabel(tenant string) string {
	if strings.HasPrefix(tenant, "_") {
		return "_" + tenant
	}
	return tenant
}

// tenantUse is the utilisation metrics of the rules with utilisation:
// the tokens each tenant took and each rule's quota.
//
// A rule's tenants are capped at max, first seen first kept: a kept
// tenant's series lives as long as its rule, so its counter never restarts
// and a rate over months stays exact; the tenants beyond the cap share one
// "_other" series. A top-N by use would follow the biggest tenants, but
// its members change as use shifts, and a tenant that drops out and comes
// back restarts its counter: the long ranges of a quota review would see
// gaps. The cap bounds the series at (max + 1) per rule, whatever clients
// send.
type tenantUse struct {
	consumed *prometheus.CounterVec // domain, rule, tenant
	quota    *prometheus.GaugeVec   // domain, rule, layer

	mu     sync.Mutex
	max    int
	byRule map[ruleID]*ruleTenants
}

// ruleTenants is one rule's tenant counters.
type ruleTenants struct {
	quota  prometheus.Gauge
	layer  string // quota's layer label
	byName map[string]prometheus.Counter
	other  prometheus.Counter // nil until a tenant is beyond the cap
}

func newTenantUse() *tenantUse {
	return &tenantUse{
		consumed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_tenant_consumed_tokens_total",
			Help: "Tokens taken by allowed requests, per tenant (the request value of the rule's last level), for rules with utilisation; tenants beyond the per-rule cap count under tenant=\"_other\" (a tenant value starting with _ gets one more: _other is __other).",
		}, []string{"domain", "rule", "tenant"}),
		quota: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ratelimit_tenant_quota_tokens_per_second",
			Help: "Each tenant's quota of a rule with utilisation, in tokens per second: its global limit (layer=\"global\", the fleet's) or, for a local-only rule, its local limit (layer=\"local\", one node's).",
		}, []string{"domain", "rule", "layer"}),
		byRule: make(map[ruleID]*ruleTenants),
	}
}

// quotaOf returns a rule's quota: its global limit, else its local one.
func quotaOf(r *descriptors.Rule) (*bucket.Limit, string) {
	if r.Global != nil {
		return r.Global, "global"
	}
	return r.Local, "local"
}

// add counts cost tokens that tenant took under rule r, an opted-in rule.
func (u *tenantUse) add(r *descriptors.Rule, tenant string, cost uint64) {
	lim, layer := quotaOf(r)
	id := ruleID{r.Domain, r.Path}
	u.mu.Lock()
	rt := u.byRule[id]
	if rt == nil {
		rt = &ruleTenants{byName: make(map[string]prometheus.Counter)}
		u.byRule[id] = rt
	}
	if rt.layer != layer {
		// First hit, or a reload that kept the path and moved the quota
		// between layers.
		if rt.quota != nil {
			u.quota.DeleteLabelValues(r.Domain, r.Path, rt.layer)
		}
		rt.quota, rt.layer = u.quota.WithLabelValues(r.Domain, r.Path, layer), layer
	}
	c := rt.byName[tenant]
	if c == nil {
		switch {
		case len(rt.byName) < u.max:
			c = u.consumed.WithLabelValues(r.Domain, r.Path, tenantLabel(tenant))
			rt.byName[tenant] = c
		case rt.other == nil:
			rt.other = u.consumed.WithLabelValues(r.Domain, r.Path, otherTenant)
			c = rt.other
		default:
			c = rt.other
		}
	}
	quota := rt.quota
	u.mu.Unlock()
	// Set on every hit rather than once: a reload that changes the rule's
	// limit keeps its path, and the gauge follows.
	if lim != nil && lim.Period > 0 {
		quota.Set(float64(lim.Requests) / lim.Period.Seconds())
	}
	if cost > 0 {
		c.Add(float64(cost))
	}
}

// forget deletes the series of rule id, if it has any.
func (u *tenantUse) forget(id ruleID) {
	u.mu.Lock()
	_, had := u.byRule[id]
	delete(u.byRule, id)
	u.mu.Unlock()
	if !had {
		return
	}
	u.consumed.DeletePartialMatch(prometheus.Labels{"domain": id.domain, "rule": id.path})
	u.quota.DeletePartialMatch(prometheus.Labels{"domain": id.domain, "rule": id.path})
}
