package examples

import (
	"io"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	adaptivev3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/adaptive_concurrency/v3"
	localratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/local_ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/sluice-rls/sluice/cmd/rls/flags"

	"github.com/google/go-cmp/cmp"
)

const (
	localRateLimitFilter = "envoy.filters.http.local_ratelimit"
	adaptiveFilter       = "envoy.filters.http.adaptive_concurrency"
	composeBootstrap     = "compose/envoy.yaml"
)

// loadBootstrapFile decodes an Envoy bootstrap file, as loadBootstrap does
// envoy.yaml.
func loadBootstrapFile(t *testing.T, name string) *bootstrapv3.Bootstrap {
	t.Helper()
	docs := yamlDocs(t, name)
	if len(docs) != 1 {
		t.Fatalf("%s has %d documents, want 1", name, len(docs))
	}
	var b bootstrapv3.Bootstrap
	if err := unmarshalProto(docs[0], &b); err != nil {
		t.Fatalf("%s as envoy.config.bootstrap.v3.Bootstrap: %v", name, err)
	}
	return &b
}

func TestComposeEnvoyBootstrapValidates(t *testing.T) {
	validateProto(t, composeBootstrap, loadBootstrapFile(t, composeBootstrap))
}

// TestComposeEnvoyIsEnvoyYAMLPlusFuses checks that compose/envoy.yaml is
// envoy.yaml with the local rate limit filter first and the adaptive
// concurrency filter last before the router: routes, rate_limits, the
// ratelimit filter and the clusters are equal, so every check of
// envoy.yaml's descriptors and clusters holds for it too.
func TestComposeEnvoyIsEnvoyYAMLPlusFuses(t *testing.T) {
	base, b := loadBootstrap(t), loadBootstrapFile(t, composeBootstrap)
	baseHCM, hcm := connectionManager(t, base), connectionManager(t, b)
	if d := cmp.Diff(baseHCM.GetRouteConfig(), hcm.GetRouteConfig(), protocmp.Transform()); d != "" {
		t.Errorf("route_config differs from envoy.yaml's (-envoy.yaml +%s):\n%s", composeBootstrap, d)
	}
	if d := cmp.Diff(base.GetStaticResources().GetClusters(), b.GetStaticResources().GetClusters(), protocmp.Transform()); d != "" {
		t.Errorf("clusters differ from envoy.yaml's (-envoy.yaml +%s):\n%s", composeBootstrap, d)
	}

	fs := hcm.GetHttpFilters()
	var names []string
	for _, f := range fs {
		names = append(names, f.GetName())
	}
	want := []string{localRateLimitFilter, rateLimitFilter, adaptiveFilter, routerFilter}
	if !slices.Equal(names, want) {
		t.Fatalf("http_filters %q, want %q", names, want)
	}
	if !proto.Equal(fs[1], baseHCM.GetHttpFilters()[0]) {
		t.Errorf("ratelimit filter %v differs from envoy.yaml's %v", fs[1], baseHCM.GetHttpFilters()[0])
	}

	var local localratelimitv3.LocalRateLimit
	if err := fs[0].GetTypedConfig().UnmarshalTo(&local); err != nil {
		t.Fatalf("%s: %v", localRateLimitFilter, err)
	}
	tb := local.GetTokenBucket()
	rate := float64(tb.GetTokensPerFill().GetValue()) / tb.GetFillInterval().AsDuration().Seconds()
	// A fuse, not a limit: far above the fleet-wide limit of any one
	// client address in the rules envoy.yaml is written for (100/s).
	if rate < 500 || tb.GetMaxTokens() < tb.GetTokensPerFill().GetValue() {
		t.Errorf("%s: token bucket %v (%.0f/s): want at least 500/s, max_tokens ≥ tokens_per_fill", localRateLimitFilter, tb, rate)
	}
	// Without filter_enabled and filter_enforced at 100% the filter only
	// counts, or enforces nothing.
	for what, fp := range map[string]*typev3.FractionalPercent{
		"filter_enabled":  local.GetFilterEnabled().GetDefaultValue(),
		"filter_enforced": local.GetFilterEnforced().GetDefaultValue(),
	} {
		if fp.GetNumerator() != 100 || fp.GetDenominator() != typev3.FractionalPercent_HUNDRED {
			t.Errorf("%s: %s %v, want 100/HUNDRED", localRateLimitFilter, what, fp)
		}
	}

	var ac adaptivev3.AdaptiveConcurrency
	if err := fs[2].GetTypedConfig().UnmarshalTo(&ac); err != nil {
		t.Fatalf("%s: %v", adaptiveFilter, err)
	}
	gc := ac.GetGradientControllerConfig()
	if gc == nil || gc.GetConcurrencyLimitParams().GetConcurrencyUpdateInterval().AsDuration() <= 0 || gc.GetMinRttCalcParams().GetInterval().AsDuration() < time.Second {
		t.Errorf("%s: %v, want a gradient controller with an update interval and a min RTT interval of a second or more", adaptiveFilter, &ac)
	}
	if v := ac.GetEnabled().GetDefaultValue(); v != nil && !v.GetValue() {
		t.Errorf("%s: disabled", adaptiveFilter)
	}
}

// TestComposeFile checks what the compose project wires between files:
// sluice's command parses with rls serve's flag parser, Envoy's sluice
// cluster and Prometheus reach the ports it listens on, and Envoy mounts
// compose/envoy.yaml where the image reads it. (The schema module loads
// the compose file with compose-go.)
func TestComposeFile(t *testing.T) {
	docs := yamlDocs(t, "compose/compose.yaml")
	services, _ := dig(docs[0].(map[string]any), "services").(map[string]any)
	sluice, _ := services["sluice"].(map[string]any)
	cmdAny, _ := sluice["command"].([]any)
	var cmdArgs []string
	for _, a := range cmdAny {
		cmdArgs = append(cmdArgs, a.(string))
	}
	if len(cmdArgs) == 0 || cmdArgs[0] != "serve" {
		t.Fatalf("compose sluice command %q, want serve and its flags", cmdArgs)
	}
	st, err := flags.ParseServe(cmdArgs[1:], func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatalf("compose sluice command %q: %v", cmdArgs, err)
	}
	if st.Redis == "" {
		t.Errorf("compose sluice runs without --redis")
	}

	// Envoy's sluice cluster: the compose service name, the gRPC port.
	var sluiceCluster *clusterv3.Cluster
	for _, c := range loadBootstrapFile(t, composeBootstrap).GetStaticResources().GetClusters() {
		sa := c.GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
		if services[sa.GetAddress()] == nil {
			t.Errorf("%s: cluster %s reaches %s, not a compose service", composeBootstrap, c.GetName(), sa.GetAddress())
		}
		if c.GetName() == "sluice" {
			sluiceCluster = c
			if int(sa.GetPortValue()) != addrPort(t, st.GRPCAddr) {
				t.Errorf("cluster sluice port %d, but sluice's --grpc-addr is %s", sa.GetPortValue(), st.GRPCAddr)
			}
		}
	}
	if sluiceCluster == nil {
		t.Errorf("%s: no sluice cluster", composeBootstrap)
	}

	envoy, _ := services["envoy"].(map[string]any)
	vols, _ := envoy["volumes"].([]any)
	if !slices.Contains(vols, any("./envoy.yaml:/etc/envoy/envoy.yaml:ro")) {
		t.Errorf("compose envoy volumes %q: compose/envoy.yaml is not mounted at /etc/envoy/envoy.yaml", vols)
	}

	// Prometheus scrapes sluice's HTTP port and Envoy's admin port.
	prom := yamlDocs(t, "compose/prometheus.yml")[0].(map[string]any)
	targets := make(map[string]bool)
	for _, sc := range prom["scrape_configs"].([]any) {
		for _, stc := range sc.(map[string]any)["static_configs"].([]any) {
			for _, tg := range stc.(map[string]any)["targets"].([]any) {
				targets[tg.(string)] = true
			}
		}
	}
	admin := loadBootstrapFile(t, composeBootstrap).GetAdmin().GetAddress().GetSocketAddress()
	for _, want := range []string{
		net.JoinHostPort("sluice", strconv.Itoa(addrPort(t, st.HTTPAddr))),
		net.JoinHostPort("envoy", strconv.Itoa(int(admin.GetPortValue()))),
	} {
		if !targets[want] {
			t.Errorf("compose/prometheus.yml targets %v lack %s", targets, want)
		}
	}
	if admin.GetAddress() != "0.0.0.0" {
		t.Errorf("%s: admin on %s: Prometheus in another container cannot scrape it", composeBootstrap, admin.GetAddress())
	}
}
