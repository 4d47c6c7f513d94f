package examples

import (
	"cmp"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"

	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/ruleset"
)

const (
	rateLimitFilter     = "envoy.filters.http.ratelimit"
	routerFilter        = "envoy.filters.http.router"
	httpProtocolOptions = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
	grayKey             = "gray" // sluice's default --gray-key
)

// loadBootstrap decodes envoy.yaml into Envoy's Bootstrap proto.
func loadBootstrap(t *testing.T) *bootstrapv3.Bootstrap {
	t.Helper()
	docs := yamlDocs(t, "envoy.yaml")
	if len(docs) != 1 {
		t.Fatalf("envoy.yaml has %d documents, want 1", len(docs))
	}
	var b bootstrapv3.Bootstrap
	if err := unmarshalProto(docs[0], &b); err != nil {
		t.Fatalf("envoy.yaml as envoy.config.bootstrap.v3.Bootstrap: %v", err)
	}
	return &b
}

// connectionManager returns the HTTP connection manager of the bootstrap's
// only listener.
func connectionManager(t *testing.T, b *bootstrapv3.Bootstrap) *hcmv3.HttpConnectionManager {
	t.Helper()
	ls := b.GetStaticResources().GetListeners()
	if len(ls) != 1 || len(ls[0].GetFilterChains()) != 1 || len(ls[0].GetFilterChains()[0].GetFilters()) != 1 {
		t.Fatalf("want one listener with one filter chain of one filter, got %v", ls)
	}
	var hcm hcmv3.HttpConnectionManager
	if err := ls[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatalf("listener filter: %v", err)
	}
	return &hcm
}

// rateLimitConfig returns the ratelimit filter's configuration and checks
// the filter order: the ratelimit filter, then the router, last.
func rateLimitConfig(t *testing.T, hcm *hcmv3.HttpConnectionManager) *ratelimitv3.RateLimit {
	t.Helper()
	fs := hcm.GetHttpFilters()
	var names []string
	for _, f := range fs {
		names = append(names, f.GetName())
	}
	if len(fs) != 2 || names[0] != rateLimitFilter || names[1] != routerFilter {
		t.Fatalf("http_filters %q, want [%s %s]", names, rateLimitFilter, routerFilter)
	}
	var rl ratelimitv3.RateLimit
	if err := fs[0].GetTypedConfig().UnmarshalTo(&rl); err != nil {
		t.Fatalf("%s typed_config: %v", rateLimitFilter, err)
	}
	return &rl
}

func TestEnvoyBootstrapValidates(t *testing.T) {
	b := loadBootstrap(t)
	validateProto(t, "envoy.yaml", b)
}

func TestEnvoyRateLimitFilter(t *testing.T) {
	b := loadBootstrap(t)
	rl := rateLimitConfig(t, connectionManager(t, b))
	checks := []struct {
		what      string
		got, want any
	}{
		{"domain", rl.GetDomain(), "edge"},
		{"failure_mode_deny", rl.GetFailureModeDeny(), false},
		{"timeout", rl.GetTimeout().AsDuration(), 20 * time.Millisecond},
		{"enable_x_ratelimit_headers", rl.GetEnableXRatelimitHeaders(), ratelimitv3.RateLimit_DRAFT_VERSION_03},
		{"rate_limited_as_resource_exhausted", rl.GetRateLimitedAsResourceExhausted(), true},
		{"rate_limit_service.transport_api_version", rl.GetRateLimitService().GetTransportApiVersion(), corev3.ApiVersion_V3},
		{"rate_limit_service cluster", rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName(), "sluice"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("ratelimit filter %s = %v, want %v", c.what, c.got, c.want)
		}
	}
}

func TestEnvoySluiceCluster(t *testing.T) {
	b := loadBootstrap(t)
	clusters := make(map[string]*clusterv3.Cluster)
	for _, c := range b.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
	}
	sluice := clusters["sluice"]
	if sluice == nil {
		t.Fatalf("no cluster named sluice among %v", clusters)
	}
	checkHTTP2(t, "cluster sluice", sluice)
	eps := sluice.GetLoadAssignment().GetEndpoints()
	if len(eps) != 1 || len(eps[0].GetLbEndpoints()) != 1 {
		t.Fatalf("cluster sluice endpoints %v, want one", eps)
	}
	if port := eps[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue(); port != 8081 {
		t.Errorf("cluster sluice port %d, want sluice's gRPC port 8081", port)
	}
	checkGRPCHealth(t, "cluster sluice", sluice)

	// Every route goes to a defined cluster.
	for _, vh := range connectionManager(t, b).GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			if c := r.GetRoute().GetCluster(); clusters[c] == nil {
				t.Errorf("route %v goes to undefined cluster %q", r.GetMatch(), c)
			}
		}
	}
}

// checkGRPCHealth checks that c health-checks its hosts actively with
// grpc.health.v1, which sluice serves (NOT_SERVING once it drains), often
// enough to drop a draining pod within the preStop pause.
func checkGRPCHealth(t *testing.T, where string, c *clusterv3.Cluster) {
	t.Helper()
	for _, hc := range c.GetHealthChecks() {
		if hc.GetGrpcHealthCheck() == nil {
			continue
		}
		if iv := hc.GetInterval().AsDuration(); iv <= 0 || iv*time.Duration(max(hc.GetUnhealthyThreshold().GetValue(), 1)) > 5*time.Second {
			t.Errorf("%s: gRPC health check every %v, %d failures to eject: a draining pod stays in rotation past the 5s preStop pause", where, iv, hc.GetUnhealthyThreshold().GetValue())
		}
		return
	}
	t.Errorf("%s: no active gRPC health check (sluice serves grpc.health.v1)", where)
}

// checkHTTP2 checks that c speaks HTTP/2 to its upstream, as gRPC needs.
func checkHTTP2(t *testing.T, where string, c *clusterv3.Cluster) {
	t.Helper()
	anyOpts, ok := c.GetTypedExtensionProtocolOptions()[httpProtocolOptions]
	if !ok {
		t.Errorf("%s: no typed_extension_protocol_options %s", where, httpProtocolOptions)
		return
	}
	var opts upstreamhttpv3.HttpProtocolOptions
	if err := anyOpts.UnmarshalTo(&opts); err != nil {
		t.Errorf("%s: %v", where, err)
		return
	}
	if opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		t.Errorf("%s: protocol options %v, want explicit_http_config.http2_protocol_options", where, &opts)
	}
}

// envoyRateLimits returns every rate_limits entry of the bootstrap: the
// virtual hosts' and the routes'.
func envoyRateLimits(t *testing.T, b *bootstrapv3.Bootstrap) []*routev3.RateLimit {
	t.Helper()
	var out []*routev3.RateLimit
	for _, vh := range connectionManager(t, b).GetRouteConfig().GetVirtualHosts() {
		out = append(out, vh.GetRateLimits()...)
		for _, r := range vh.GetRoutes() {
			out = append(out, r.GetRoute().GetRateLimits()...)
		}
	}
	return out
}

// TestEnvoyDescriptorsHaveRules checks that every descriptor envoy.yaml can
// send matches a rule of the rules it is written for: the embedded example
// and the Kubernetes ConfigMap (gray-only descriptors excepted: sluice
// strips them).
func TestEnvoyDescriptorsHaveRules(t *testing.T) {
	rls := envoyRateLimits(t, loadBootstrap(t))
	t.Run("embedded rules", func(t *testing.T) {
		embedded := map[string]string{ruleset.DefaultRulesName: string(ruleset.DefaultRules())}
		checkDescriptorRules(t, "envoy.yaml", loadRules(t, embedded, "edge"), rls)
	})
	t.Run("kubernetes ConfigMap", func(t *testing.T) {
		cm := findObject(t, "kubernetes/configmap.yaml", "ConfigMap", "sluice-rules")
		checkDescriptorRules(t, "envoy.yaml", loadRules(t, cm.Data, "edge"), rls)
	})
}

// loadRules parses rule files (name → content) with sluice's parser and
// returns the domain.
func loadRules(t *testing.T, files map[string]string, domain string) *descriptors.Domain {
	t.Helper()
	var parsed []*descriptors.File
	for name, content := range files {
		f, err := descriptors.Parse(name, []byte(content))
		if err != nil {
			t.Fatalf("rules %s: %v", name, err)
		}
		parsed = append(parsed, f)
	}
	cfg, err := descriptors.New(parsed, descriptors.Options{GrayKey: "gray"})
	if err != nil {
		t.Fatalf("rules: %v", err)
	}
	for _, w := range cfg.Warnings() {
		t.Errorf("rules load with a warning (rls validate --strict fails): %v", w)
	}
	d := cfg.Domain(domain)
	if d == nil {
		t.Fatalf("rules define domains %v, not %q", cfg.Domains(), domain)
	}
	return d
}

// checkDescriptorRules checks each rate_limits entry: it cannot produce an
// empty descriptor (which sluice answers OK for that descriptor: an entry
// that limits nothing, docs/design.md), and the descriptor
// it produces, with sample values where the request supplies them, matches
// a rule of dom.
func checkDescriptorRules(t *testing.T, where string, dom *descriptors.Domain, rls []*routev3.RateLimit) {
	t.Helper()
	if len(rls) == 0 {
		t.Fatalf("%s: no rate_limits", where)
	}
	for i, rl := range rls {
		entries, mayBeEmpty := descriptorShape(t, rl)
		if mayBeEmpty {
			t.Errorf("%s: rate_limits entry %d (%v) sends an empty descriptor when its headers are absent (skip_if_absent on every action), which limits nothing", where, i, rl)
		}
		var rest []descriptors.Entry
		for _, e := range entries {
			if e.Key == grayKey {
				if e.Value != "true" {
					t.Errorf("%s: rate_limits entry %d sends %s=%q; sluice marks gray only %s=true", where, i, grayKey, e.Value, grayKey)
				}
				continue
			}
			rest = append(rest, e)
		}
		if len(rest) == 0 {
			continue
		}
		if r := dom.Match(rest); r == nil {
			t.Errorf("%s: descriptor %v (rate_limits entry %d) matches no rule of domain %s", where, rest, i, dom.Name)
		} else {
			t.Logf("%s: %v → %s", where, rest, r)
		}
	}
}

// descriptorShape returns the entries one rate_limits entry produces, with
// made-up values where they come from the request, and whether it can
// produce an empty descriptor. It fails on actions it does not know.
func descriptorShape(t *testing.T, rl *routev3.RateLimit) (entries []descriptors.Entry, mayBeEmpty bool) {
	t.Helper()
	mayBeEmpty = true
	for _, a := range rl.GetActions() {
		switch {
		case a.GetRemoteAddress() != nil:
			entries = append(entries, descriptors.Entry{Key: "remote_address", Value: "192.0.2.10"})
			mayBeEmpty = false
		case a.GetRequestHeaders() != nil:
			h := a.GetRequestHeaders()
			entries = append(entries, descriptors.Entry{Key: h.GetDescriptorKey(), Value: "sample-" + h.GetHeaderName()})
			mayBeEmpty = mayBeEmpty && h.GetSkipIfAbsent()
		case a.GetGenericKey() != nil:
			g := a.GetGenericKey()
			entries = append(entries, descriptors.Entry{Key: cmp.Or(g.GetDescriptorKey(), "generic_key"), Value: g.GetDescriptorValue()})
			mayBeEmpty = false
		case a.GetHeaderValueMatch() != nil:
			h := a.GetHeaderValueMatch()
			entries = append(entries, descriptors.Entry{Key: cmp.Or(h.GetDescriptorKey(), "header_match"), Value: h.GetDescriptorValue()})
			mayBeEmpty = false
		default:
			t.Fatalf("rate limit action %v: not a kind this test knows", a)
		}
	}
	return entries, mayBeEmpty
}
