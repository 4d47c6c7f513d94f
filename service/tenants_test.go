package service_test

import (
	"fmt"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-rls/sluice/ruleset"
	"github.com/sluice-rls/sluice/service"
)

const tenantRules = `
domain: api
descriptors:
  - key: tenant
    utilisation: true
    rate_limit: {unit: minute, requests_per_unit: 120}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 120}
  - key: shop
    utilisation: true
    rate_limit:
      unit: minute
      requests_per_unit: 60
      local: {unit: second, requests_per_unit: 10}
  - key: ip
    utilisation: true
    rate_limit:
      local: {unit: second, requests_per_unit: 5, burst: 5}
`

// TestTenantUtilisationOnlyOptedIn: the tenant metrics exist for the rules
// with utilisation, not for the others, and count the tokens of allowed
// hits only (hits_addend included), against the rule's global quota, or
// its local one for a local-only rule.
func TestTenantUtilisationOnlyOptedIn(t *testing.T) {
	h := newHarness(t, tenantRules)
	h.call(t, request("api", desc("tenant=acme"), desc("user=bob"), desc("shop=s1")))
	req := request("api", desc("tenant=acme"))
	req.HitsAddend = 4
	h.call(t, req)
	for range 7 { // 5 allowed, 2 refused by the local bucket
		h.call(t, request("api", desc("ip=10.0.0.1")))
	}
	if n := seriesCount(t, h, "ratelimit_tenant_consumed_tokens_total", "api.user"); n != 0 {
		t.Errorf("%d tenant series for the rule without utilisation", n)
	}
	for _, c := range []struct {
		rule, tenant string
		want         float64
	}{
		{"api.tenant", "acme", 5},
		{"api.shop", "s1", 1},
		{"api.ip", "10.0.0.1", 5},
	} {
		got := metricValue(t, h, "ratelimit_tenant_consumed_tokens_total", map[string]string{"domain": "api", "rule": c.rule, "tenant": c.tenant})
		if got != c.want {
			t.Errorf("%s tenant %s consumed %v tokens, want %v", c.rule, c.tenant, got, c.want)
		}
	}
	for _, c := range []struct {
		rule, layer string
		want        float64
	}{
		{"api.tenant", "global", 2},
		{"api.shop", "global", 1},
		{"api.ip", "local", 5},
	} {
		got := metricValue(t, h, "ratelimit_tenant_quota_tokens_per_second", map[string]string{"domain": "api", "rule": c.rule, "layer": c.layer})
		if got != c.want {
			t.Errorf("%s quota (%s) = %v tokens/s, want %v", c.rule, c.layer, got, c.want)
		}
	}
}

// TestTenantUtilisationBounded: many tenants make at most MaxTenants series
// of their own and one "_other", which counts the rest; a reload that
// drops utilisation deletes the series.
func TestTenantUtilisationBounded(t *testing.T) {
	const tenants, max = 1000, 10
	store := ruleset.NewStore(mustRules(t, tenantRules))
	h := newHarness(t, tenantRules, func(o *service.Options) { o.Rules = store; o.MaxTenants = max })
	for i := range tenants {
		h.call(t, request("api", desc(fmt.Sprintf("tenant=t%d", i))))
	}
	if n := seriesCount(t, h, "ratelimit_tenant_consumed_tokens_total", "api.tenant"); n != max+1 {
		t.Errorf("%d series for %d tenants, want %d (the cap and _other)", n, tenants, max+1)
	}
	other := metricValue(t, h, "ratelimit_tenant_consumed_tokens_total", map[string]string{"rule": "api.tenant", "tenant": "_other"})
	if other != tenants-max {
		t.Errorf("_other counts %v tokens, want %d", other, tenants-max)
	}
	// A kept tenant keeps its own series past the cap.
	h.call(t, request("api", desc("tenant=t0")))
	if got := metricValue(t, h, "ratelimit_tenant_consumed_tokens_total", map[string]string{"rule": "api.tenant", "tenant": "t0"}); got != 2 {
		t.Errorf("t0 consumed %v, want 2", got)
	}
	store.Swap(mustRules(t, `
domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 120}
`))
	if resp := h.call(t, request("api", desc("tenant=t0"))); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("after the reload: %v", resp.GetOverallCode())
	}
	for _, name := range []string{"ratelimit_tenant_consumed_tokens_total", "ratelimit_tenant_quota_tokens_per_second"} {
		if n := seriesCount(t, h, name, "api."); n != 0 {
			t.Errorf("%d series of %s left after the reload dropped utilisation", n, name)
		}
	}
}

// TestTenantQuotaFollowsReload: a reload that keeps a rule's path but makes
// it local-only moves its quota series to layer="local", with the new limit.
func TestTenantQuotaFollowsReload(t *testing.T) {
	store := ruleset.NewStore(mustRules(t, tenantRules))
	h := newHarness(t, tenantRules, func(o *service.Options) { o.Rules = store })
	h.call(t, request("api", desc("tenant=acme")))
	store.Swap(mustRules(t, `
domain: api
descriptors:
  - key: tenant
    utilisation: true
    rate_limit:
      local: {unit: second, requests_per_unit: 7}
`))
	h.call(t, request("api", desc("tenant=acme")))
	if n := seriesCount(t, h, "ratelimit_tenant_quota_tokens_per_second", "api.tenant"); n != 1 {
		t.Errorf("%d quota series after the reload, want 1", n)
	}
	if got := metricValue(t, h, "ratelimit_tenant_quota_tokens_per_second", map[string]string{"rule": "api.tenant", "layer": "local"}); got != 7 {
		t.Errorf("local quota %v, want 7", got)
	}
	if got := metricValue(t, h, "ratelimit_tenant_consumed_tokens_total", map[string]string{"rule": "api.tenant", "tenant": "acme"}); got != 2 {
		t.Errorf("acme consumed %v across the reload, want 2", got)
	}
}

// TestTenantNamedOtherIsNotTheOverflow: a tenant whose value is "_other"
// keeps a series of its own, labelled "__other" (a leading "_" is
// doubled), apart from tenant="_other", which counts only the tenants
// beyond the cap.
func TestTenantNamedOtherIsNotTheOverflow(t *testing.T) {
	h := newHarness(t, tenantRules, func(o *service.Options) { o.MaxTenants = 2 })
	for _, tenant := range []string{"_other", "_other", "acme", "late1", "late2", "late3"} {
		h.call(t, request("api", desc("tenant="+tenant)))
	}
	if n := seriesCount(t, h, "ratelimit_tenant_consumed_tokens_total", "api.tenant"); n != 3 {
		t.Errorf("%d series, want 3: the two kept tenants and the overflow", n)
	}
	for tenant, want := range map[string]float64{"__other": 2, "acme": 1, "_other": 3} {
		got := metricValue(t, h, "ratelimit_tenant_consumed_tokens_total", map[string]string{"rule": "api.tenant", "tenant": tenant})
		if got != want {
			t.Errorf("tenant=%q counts %v tokens, want %v", tenant, got, want)
		}
	}
}
