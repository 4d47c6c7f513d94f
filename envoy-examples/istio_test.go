package examples

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"testing"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-rls/sluice/descriptors"
)

// envoyFilterSpec is the part of an Istio EnvoyFilter the tests read.
type envoyFilterSpec struct {
	WorkloadSelector struct {
		Labels map[string]string `yaml:"labels"`
	} `yaml:"workloadSelector"`
	TargetRefs []struct {
		Group string `yaml:"group"`
		Kind  string `yaml:"kind"`
		Name  string `yaml:"name"`
	} `yaml:"targetRefs"`
	ConfigPatches []struct {
		ApplyTo string         `yaml:"applyTo"`
		Match   map[string]any `yaml:"match"`
		Patch   struct {
			Operation string `yaml:"operation"`
			Value     any    `yaml:"value"`
		} `yaml:"patch"`
	} `yaml:"configPatches"`
}

// patchTypes maps an EnvoyFilter applyTo to the Envoy message its patch
// value is.
var patchTypes = map[string]func() proto.Message{
	"LISTENER":            func() proto.Message { return &listenerv3.Listener{} },
	"NETWORK_FILTER":      func() proto.Message { return &listenerv3.Filter{} },
	"HTTP_FILTER":         func() proto.Message { return &hcmv3.HttpFilter{} },
	"ROUTE_CONFIGURATION": func() proto.Message { return &routev3.RouteConfiguration{} },
	"VIRTUAL_HOST":        func() proto.Message { return &routev3.VirtualHost{} },
	"HTTP_ROUTE":          func() proto.Message { return &routev3.Route{} },
	"CLUSTER":             func() proto.Message { return &clusterv3.Cluster{} },
}

// istioPatches is what the EnvoyFilters of one directory add to Envoy.
type istioPatches struct {
	filters    []*ratelimitv3.RateLimit      // ratelimit filters inserted
	clusters   map[string]*clusterv3.Cluster // clusters added, by name
	rateLimits []*routev3.RateLimit          // virtual-host and route rate_limits merged in
}

// TestEnvoyFilters decodes every EnvoyFilter patch value into the Envoy
// message it patches (unknown fields are errors, as in istiod) and
// validates whole objects (ADD, INSERT_*, REPLACE) with Envoy's proto
// rules; MERGE fragments are validated inside their typed configs. Then the
// pieces must fit: the ratelimit filter sits before the router, calls a
// cluster the patches add, which speaks HTTP/2 to a sluice Service defined
// beside them, and every descriptor sent matches a rule of the sluice
// ConfigMap there.
func TestEnvoyFilters(t *testing.T) {
	found := false
	byDir := objectsByDir(t)
	for dir, objs := range byDir {
		efs := ofKind(objs, "EnvoyFilter")
		if len(efs) == 0 {
			continue
		}
		found = true
		// A variant in a subdirectory (istio/gateway-api/) is applied
		// with sluice from its parent (istio/sluice.yaml).
		if parent := path.Dir(dir); parent != "." {
			for _, o := range byDir[parent] {
				if o.Kind != "EnvoyFilter" {
					objs = append(objs, o)
				}
			}
		}
		p := istioPatches{clusters: make(map[string]*clusterv3.Cluster)}
		for _, ef := range efs {
			decodePatches(t, ef, &p, objs)
		}
		if len(p.filters) != 1 {
			t.Fatalf("%s/: %d ratelimit filters inserted, want 1", dir, len(p.filters))
		}
		rl := p.filters[0]
		name := rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()
		c := p.clusters[name]
		if c == nil {
			t.Fatalf("%s/: the ratelimit filter calls cluster %q, which no CLUSTER patch adds", dir, name)
		}
		checkHTTP2(t, dir+"/ cluster "+name, c)
		checkGRPCHealth(t, dir+"/ cluster "+name, c)
		checkClusterService(t, dir, c, objs)
		checkDescriptorRules(t, dir+"/ EnvoyFilters", configMapDomain(t, objs, rl.GetDomain()), p.rateLimits)
	}
	if !found {
		t.Fatal("no EnvoyFilter found")
	}
}

// decodePatches decodes and validates the patches of one EnvoyFilter and
// collects what they add into p.
func decodePatches(t *testing.T, ef *object, p *istioPatches, objs []*object) {
	t.Helper()
	var spec envoyFilterSpec
	ef.spec(t, &spec)
	context := patchContext(t, ef, &spec, objs)
	for i, cp := range spec.ConfigPatches {
		where := fmt.Sprintf("%s: configPatches[%d] %s %s", ef, i, cp.ApplyTo, cp.Patch.Operation)
		if got := cp.Match["context"]; got != context {
			t.Errorf("%s: match.context %v, want %s for the proxy it attaches to", where, got, context)
		}
		if _, ok := cp.Match["waypoint"]; ok != (context == "WAYPOINT") {
			t.Errorf("%s: a waypoint match goes with context WAYPOINT and only with it", where)
		}
		newMsg, ok := patchTypes[cp.ApplyTo]
		if !ok {
			t.Errorf("%s: applyTo %q unknown to this test", where, cp.ApplyTo)
			continue
		}
		m := newMsg()
		if err := unmarshalProto(cp.Patch.Value, m); err != nil {
			t.Errorf("%s: value as %T: %v", where, m, err)
			continue
		}
		switch cp.Patch.Operation {
		case "ADD", "INSERT_BEFORE", "INSERT_AFTER", "INSERT_FIRST", "REPLACE":
			validateProto(t, where, m)
		case "MERGE":
			for _, inner := range packedMessages(t, where, m.ProtoReflect()) {
				validateProto(t, where, inner)
			}
		default:
			t.Errorf("%s: operation %q unknown to this test", where, cp.Patch.Operation)
		}

		switch m := m.(type) {
		case *hcmv3.HttpFilter:
			checkFilterPosition(t, where, cp.Match, cp.Patch.Operation)
			var rl ratelimitv3.RateLimit
			if m.GetName() != rateLimitFilter || m.GetTypedConfig().UnmarshalTo(&rl) != nil {
				t.Errorf("%s: filter %s, want %s with its RateLimit config", where, m.GetName(), rateLimitFilter)
				continue
			}
			p.filters = append(p.filters, &rl)
		case *clusterv3.Cluster:
			p.clusters[m.GetName()] = m
		case *routev3.VirtualHost:
			p.rateLimits = append(p.rateLimits, m.GetRateLimits()...)
		case *routev3.Route:
			p.rateLimits = append(p.rateLimits, m.GetRoute().GetRateLimits()...)
		}
	}
}

// patchContext returns the patch context an EnvoyFilter's patches must
// match, from what it attaches to: a workloadSelector (the classic
// ingress gateway), or targetRefs to a Gateway defined beside it in its
// namespace, of Istio's gateway class (GATEWAY) or waypoint class
// (WAYPOINT). It fails an EnvoyFilter that would patch every proxy of its
// namespace, or both selects and targets.
func patchContext(t *testing.T, ef *object, spec *envoyFilterSpec, objs []*object) string {
	t.Helper()
	selector, refs := len(spec.WorkloadSelector.Labels) > 0, len(spec.TargetRefs) > 0
	switch {
	case selector && refs:
		t.Errorf("%s: both workloadSelector and targetRefs: Istio refuses it", ef)
		return ""
	case selector:
		if spec.WorkloadSelector.Labels["istio"] == "ingressgateway" {
			return "GATEWAY"
		}
		return "SIDECAR_INBOUND"
	case !refs:
		t.Errorf("%s: no workloadSelector nor targetRefs: it would patch every proxy in its namespace", ef)
		return ""
	}
	context := ""
	for _, ref := range spec.TargetRefs {
		var gw *object
		for _, o := range ofKind(objs, "Gateway") {
			if o.Metadata.Name == ref.Name && o.Metadata.Namespace == ef.Metadata.Namespace {
				gw = o
			}
		}
		if ref.Group != "gateway.networking.k8s.io" || ref.Kind != "Gateway" || gw == nil {
			t.Errorf("%s: targetRef %+v is no Gateway defined beside it in namespace %s", ef, ref, ef.Metadata.Namespace)
			continue
		}
		var gs struct {
			GatewayClassName string `yaml:"gatewayClassName"`
		}
		gw.spec(t, &gs)
		want := map[string]string{"istio": "GATEWAY", "istio-waypoint": "WAYPOINT"}[gs.GatewayClassName]
		if want == "" {
			t.Errorf("%s: targets %s of class %q, not Istio's gateway or waypoint class", ef, gw, gs.GatewayClassName)
		}
		if context != "" && context != want {
			t.Errorf("%s: targets both gateways and waypoints", ef)
		}
		context = want
	}
	return context
}

// checkFilterPosition checks that an HTTP filter goes right before the
// router of the HTTP connection manager, as Istio documents.
func checkFilterPosition(t *testing.T, where string, match map[string]any, op string) {
	t.Helper()
	filter := dig(match, "listener", "filterChain", "filter", "name")
	sub := dig(match, "listener", "filterChain", "filter", "subFilter", "name")
	if _, ok := match["waypoint"]; ok {
		filter = dig(match, "waypoint", "filter", "name")
		sub = dig(match, "waypoint", "filter", "subFilter", "name")
	}
	if op != "INSERT_BEFORE" || filter != "envoy.filters.network.http_connection_manager" || sub != routerFilter {
		t.Errorf("%s: inserted %s %v/%v, want INSERT_BEFORE envoy.filters.network.http_connection_manager/%s",
			where, op, filter, sub, routerFilter)
	}
}

// dig follows keys through nested mappings.
func dig(m map[string]any, keys ...string) any {
	var v any = m
	for _, k := range keys {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[k]
	}
	return v
}

// checkClusterService checks that cluster c reaches a Service defined in
// objs: its one endpoint is <service>.<namespace>.svc.cluster.local on a
// port the Service exposes.
func checkClusterService(t *testing.T, dir string, c *clusterv3.Cluster, objs []*object) {
	t.Helper()
	eps := c.GetLoadAssignment().GetEndpoints()
	if len(eps) != 1 || len(eps[0].GetLbEndpoints()) != 1 {
		t.Fatalf("%s/: cluster %s endpoints %v, want one", dir, c.GetName(), eps)
	}
	sa := eps[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress()
	svcName, rest, _ := strings.Cut(sa.GetAddress(), ".")
	ns, domain, _ := strings.Cut(rest, ".")
	if domain != "svc.cluster.local" {
		t.Fatalf("%s/: cluster %s address %q, want <service>.<namespace>.svc.cluster.local", dir, c.GetName(), sa.GetAddress())
	}
	for _, s := range ofKind(objs, "Service") {
		if s.Metadata.Name != svcName || s.Metadata.Namespace != ns {
			continue
		}
		var spec serviceSpec
		s.spec(t, &spec)
		if !slices.ContainsFunc(spec.Ports, func(p servicePort) bool { return p.Port == int(sa.GetPortValue()) && p.Name == "grpc" }) {
			t.Errorf("%s/: cluster %s port %d is not the grpc port of %s", dir, c.GetName(), sa.GetPortValue(), s)
		}
		return
	}
	t.Errorf("%s/: cluster %s reaches %s, but no Service %s in namespace %s is defined there", dir, c.GetName(), sa.GetAddress(), svcName, ns)
}

// configMapDomain returns the rule domain defined by the ConfigMaps in objs.
func configMapDomain(t *testing.T, objs []*object, domain string) *descriptors.Domain {
	t.Helper()
	files := make(map[string]string)
	for _, cm := range ofKind(objs, "ConfigMap") {
		for k, v := range cm.Data {
			files[cm.file+":"+k] = v
		}
	}
	return loadRules(t, files, domain)
}

// TestGatewayRoutes checks that every HTTPRoute attaches to a Gateway of
// Istio's class defined beside it, by name and listener.
func TestGatewayRoutes(t *testing.T) {
	found := false
	for dir, objs := range objectsByDir(t) {
		for _, r := range ofKind(objs, "HTTPRoute") {
			found = true
			var spec struct {
				ParentRefs []struct {
					Name        string `yaml:"name"`
					SectionName string `yaml:"sectionName"`
				} `yaml:"parentRefs"`
			}
			r.spec(t, &spec)
			if len(spec.ParentRefs) == 0 {
				t.Errorf("%s: no parentRefs", r)
			}
			for _, ref := range spec.ParentRefs {
				ok := slices.ContainsFunc(ofKind(objs, "Gateway"), func(g *object) bool {
					var gs struct {
						GatewayClassName string `yaml:"gatewayClassName"`
						Listeners        []struct {
							Name string `yaml:"name"`
						} `yaml:"listeners"`
					}
					g.spec(t, &gs)
					return g.Metadata.Name == ref.Name && g.Metadata.Namespace == r.Metadata.Namespace && gs.GatewayClassName == "istio" &&
						(ref.SectionName == "" || slices.ContainsFunc(gs.Listeners, func(l struct {
							Name string `yaml:"name"`
						}) bool {
							return l.Name == ref.SectionName
						}))
				})
				if !ok {
					t.Errorf("%s: parentRef %+v is no listener of an Istio Gateway in %s/", r, ref, dir)
				}
			}
		}
	}
	if !found {
		t.Fatal("no HTTPRoute found")
	}
}
