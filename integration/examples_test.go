//go:build integration

package integration

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"gopkg.in/yaml.v3"

	// Typed configurations named by Any fields of envoy.yaml.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
)

// The promises written in envoy-examples/envoy.yaml, checked against a real
// sluice: the descriptors come from the file's own rate_limits actions,
// evaluated for sample requests by envoyExample.descriptors (a small model of
// Envoy's descriptor building, below). envoy-examples/ checks that the file
// is valid Envoy configuration; these tests check what it does.

const envoyExampleFile = "../envoy-examples/envoy.yaml"

// envoyExample is what envoy.yaml configures for rate limiting: the
// ratelimit filter and the virtual host whose routes and rate_limits build
// the descriptors.
type envoyExample struct {
	filter *ratelimitv3.RateLimit
	vhost  *routev3.VirtualHost
}

// loadEnvoyExample decodes envoy.yaml as Envoy does (YAML → JSON →
// proto, unknown fields rejected) and picks out the filter and the virtual
// host.
func loadEnvoyExample(t *testing.T) *envoyExample {
	t.Helper()
	data, err := os.ReadFile(envoyExampleFile)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("%s: %v", envoyExampleFile, err)
	}
	js, err := json.Marshal(doc) // yaml.v3 decodes string-keyed mappings as map[string]any
	if err != nil {
		t.Fatalf("%s: %v", envoyExampleFile, err)
	}
	var b bootstrapv3.Bootstrap
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(js, &b); err != nil {
		t.Fatalf("%s: %v", envoyExampleFile, err)
	}
	var hcm hcmv3.HttpConnectionManager
	if err := b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatalf("%s: connection manager: %v", envoyExampleFile, err)
	}
	e := &envoyExample{}
	for _, f := range hcm.GetHttpFilters() {
		if f.GetName() != "envoy.filters.http.ratelimit" {
			continue
		}
		e.filter = &ratelimitv3.RateLimit{}
		if err := f.GetTypedConfig().UnmarshalTo(e.filter); err != nil {
			t.Fatalf("%s: ratelimit filter: %v", envoyExampleFile, err)
		}
	}
	vhs := hcm.GetRouteConfig().GetVirtualHosts()
	if e.filter == nil || len(vhs) != 1 {
		t.Fatalf("%s: want a ratelimit filter and one virtual host", envoyExampleFile)
	}
	if e.filter.GetStage() != 0 || len(e.filter.GetRateLimits()) > 0 {
		t.Fatalf("%s: the evaluator models stage 0 and route/virtual-host rate_limits only", envoyExampleFile)
	}
	e.vhost = vhs[0]
	return e
}

// httpRequest is a downstream request as Envoy's ratelimit filter sees it.
type httpRequest struct {
	remote  string            // trusted client address: the TCP peer (use_remote_address, no trusted hops)
	path    string            // :path, query string included
	headers map[string]string // lower-case names
}

// header returns a request header, :path included, and whether it is set.
func (r httpRequest) header(name string) (string, bool) {
	if name == ":path" {
		return r.path, true
	}
	v, ok := r.headers[strings.ToLower(name)]
	return v, ok
}

// descriptors returns the descriptors Envoy's ratelimit filter sends for
// req, modelling Envoy's source/common/router/router_ratelimit.cc and
// source/extensions/filters/http/ratelimit for the features envoy.yaml uses:
//
//   - The route is the virtual host's first route whose match (path,
//     prefix or path_separated_prefix, against :path without its query
//     string) fits; header and query matchers are not modelled.
//   - The route's rate_limits come first; the virtual host's follow
//     according to the route's RateLimitPerRoute.vh_rate_limits in
//     typed_per_filter_config: OVERRIDE (default: only when the route has
//     none), INCLUDE or IGNORE. include_vh_rate_limits forces INCLUDE.
//   - Each rate_limits entry yields one descriptor: its actions' entries, in
//     order. An action that cannot produce its entry drops the descriptor,
//     except request_headers with skip_if_absent, whose entry is omitted.
//   - remote_address → ("remote_address", client address);
//     request_headers → (descriptor_key, header value);
//     generic_key → (descriptor_key or "generic_key", descriptor_value);
//     header_value_match → (descriptor_key or "header_match",
//     descriptor_value) when every header matcher matches (== expect_match,
//     default true).
//
// Anything else in the configuration fails the test rather than being
// evaluated wrongly. No descriptors means Envoy makes no call.
func (e *envoyExample) descriptors(t *testing.T, req httpRequest) []*commonv3.RateLimitDescriptor {
	t.Helper()
	route := e.route(t, req.path)
	if route.GetRoute().GetIncludeVhRateLimits() != nil {
		t.Fatalf("route %v: include_vh_rate_limits is not modelled", route.GetMatch())
	}
	vh := ratelimitv3.RateLimitPerRoute_OVERRIDE
	if cfg, ok := route.GetTypedPerFilterConfig()["envoy.filters.http.ratelimit"]; ok {
		var per ratelimitv3.RateLimitPerRoute
		if err := cfg.UnmarshalTo(&per); err != nil {
			t.Fatalf("route %v: per-route ratelimit config: %v", route.GetMatch(), err)
		}
		if len(per.GetRateLimits()) > 0 || per.GetDomain() != "" || per.GetOverrideOption() != ratelimitv3.RateLimitPerRoute_DEFAULT {
			t.Fatalf("route %v: only vh_rate_limits of RateLimitPerRoute is modelled", route.GetMatch())
		}
		vh = per.GetVhRateLimits()
	}
	entries := route.GetRoute().GetRateLimits()
	switch {
	case vh == ratelimitv3.RateLimitPerRoute_INCLUDE,
		vh == ratelimitv3.RateLimitPerRoute_OVERRIDE && len(entries) == 0:
		entries = append(entries[:len(entries):len(entries)], e.vhost.GetRateLimits()...)
	}
	var out []*commonv3.RateLimitDescriptor
	for _, rl := range entries {
		if d, ok := buildDescriptor(t, rl, req); ok {
			out = append(out, d)
		}
	}
	return out
}

// route returns the first route matching path.
func (e *envoyExample) route(t *testing.T, path string) *routev3.Route {
	t.Helper()
	path, _, _ = strings.Cut(path, "?")
	for _, r := range e.vhost.GetRoutes() {
		m := r.GetMatch()
		if len(m.GetHeaders()) > 0 || len(m.GetQueryParameters()) > 0 || m.GetRuntimeFraction() != nil {
			t.Fatalf("route %v: header, query and runtime matching are not modelled", m)
		}
		var hit bool
		switch p := m.GetPathSpecifier().(type) {
		case *routev3.RouteMatch_Path:
			hit = path == p.Path
		case *routev3.RouteMatch_Prefix:
			hit = strings.HasPrefix(path, p.Prefix)
		case *routev3.RouteMatch_PathSeparatedPrefix:
			hit = path == p.PathSeparatedPrefix || strings.HasPrefix(path, p.PathSeparatedPrefix+"/")
		default:
			t.Fatalf("route match %v is not modelled", m)
		}
		if hit {
			return r
		}
	}
	t.Fatalf("no route matches %s", path)
	return nil
}

// buildDescriptor applies one rate_limits entry's actions to req.
func buildDescriptor(t *testing.T, rl *routev3.RateLimit, req httpRequest) (*commonv3.RateLimitDescriptor, bool) {
	t.Helper()
	if rl.GetStage() != nil && rl.GetStage().GetValue() != 0 || rl.GetDisableKey() != "" || rl.GetApplyOnStreamDone() || rl.GetLimit() != nil {
		t.Fatalf("rate_limits %v: stage, disable_key, apply_on_stream_done and limit are not modelled", rl)
	}
	d := &commonv3.RateLimitDescriptor{}
	add := func(k, v string) {
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	for _, a := range rl.GetActions() {
		switch {
		case a.GetRemoteAddress() != nil:
			add("remote_address", req.remote)
		case a.GetRequestHeaders() != nil:
			h := a.GetRequestHeaders()
			v, ok := req.header(h.GetHeaderName())
			switch {
			case ok:
				add(h.GetDescriptorKey(), v)
			case !h.GetSkipIfAbsent():
				return nil, false
			}
		case a.GetGenericKey() != nil:
			g := a.GetGenericKey()
			add(cmp.Or(g.GetDescriptorKey(), "generic_key"), g.GetDescriptorValue())
		case a.GetHeaderValueMatch() != nil:
			h := a.GetHeaderValueMatch()
			want := h.GetExpectMatch() == nil || h.GetExpectMatch().GetValue()
			if matchHeaders(t, h.GetHeaders(), req) != want {
				return nil, false
			}
			add(cmp.Or(h.GetDescriptorKey(), "header_match"), h.GetDescriptorValue())
		default:
			t.Fatalf("rate limit action %v is not modelled", a)
		}
	}
	return d, true
}

// matchHeaders reports whether req matches every header matcher.
func matchHeaders(t *testing.T, ms []*routev3.HeaderMatcher, req httpRequest) bool {
	t.Helper()
	for _, m := range ms {
		v, present := req.header(m.GetName())
		var hit bool
		switch s := m.GetHeaderMatchSpecifier().(type) {
		case *routev3.HeaderMatcher_PresentMatch:
			hit = present == s.PresentMatch
		case *routev3.HeaderMatcher_StringMatch:
			hit = present && matchString(t, s.StringMatch, v)
		default:
			t.Fatalf("header matcher %v is not modelled", m)
		}
		if m.GetInvertMatch() {
			hit = !hit
		}
		if !hit {
			return false
		}
	}
	return true
}

func matchString(t *testing.T, m *matcherv3.StringMatcher, v string) bool {
	t.Helper()
	want := func(s string) string { return s }
	if m.GetIgnoreCase() {
		v, want = strings.ToLower(v), strings.ToLower
	}
	switch p := m.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		return v == want(p.Exact)
	case *matcherv3.StringMatcher_Prefix:
		return strings.HasPrefix(v, want(p.Prefix))
	case *matcherv3.StringMatcher_Suffix:
		return strings.HasSuffix(v, want(p.Suffix))
	case *matcherv3.StringMatcher_Contains:
		return strings.Contains(v, want(p.Contains))
	}
	t.Fatalf("string matcher %v is not modelled", m)
	return false
}

// descriptorStrings writes descriptors as "k=v,k=v" for comparisons.
func descriptorStrings(ds []*commonv3.RateLimitDescriptor) []string {
	out := make([]string, 0, len(ds))
	for _, d := range ds {
		var kv []string
		for _, e := range d.GetEntries() {
			kv = append(kv, e.GetKey()+"="+e.GetValue())
		}
		out = append(out, strings.Join(kv, ","))
	}
	return out
}

// TestExampleEnvoyDescriptors pins what envoy.yaml makes Envoy send.
func TestExampleEnvoyDescriptors(t *testing.T) {
	t.Parallel()
	e := loadEnvoyExample(t)
	if got := e.filter.GetDomain(); got != "edge" {
		t.Fatalf("ratelimit filter domain %q, want edge (the example rules' domain)", got)
	}
	tests := []struct {
		name string
		req  httpRequest
		want []string
	}{
		{"anonymous", httpRequest{remote: "10.0.0.1", path: "/"},
			[]string{"remote_address=10.0.0.1"}},
		{"user", httpRequest{remote: "10.0.0.1", path: "/cart", headers: map[string]string{"x-user-id": "alice"}},
			[]string{"remote_address=10.0.0.1", "user_id=alice"}},
		{"orders: route+user as one descriptor, virtual-host limits included",
			httpRequest{remote: "10.0.0.1", path: "/api/orders/7?full=1", headers: map[string]string{"x-user-id": "alice"}},
			[]string{"route=/api/orders,user_id=alice", "remote_address=10.0.0.1", "user_id=alice"}},
		{"orders root", httpRequest{remote: "10.0.0.1", path: "/api/orders", headers: map[string]string{"x-user-id": "alice"}},
			[]string{"route=/api/orders,user_id=alice", "remote_address=10.0.0.1", "user_id=alice"}},
		{"orders without a user: no route descriptor", httpRequest{remote: "10.0.0.1", path: "/api/orders/7"},
			[]string{"remote_address=10.0.0.1"}},
		{"not the orders route", httpRequest{remote: "10.0.0.1", path: "/api/ordersx", headers: map[string]string{"x-user-id": "alice"}},
			[]string{"remote_address=10.0.0.1", "user_id=alice"}},
		{"health check: route only", httpRequest{remote: "50.0.0.5", path: "/healthz", headers: map[string]string{"x-user-id": "alice", "x-canary": "true"}},
			[]string{"route=/healthz"}},
		{"tenant and canary", httpRequest{remote: "10.0.0.2", path: "/", headers: map[string]string{"x-tenant-id": "t1", "x-canary": "true"}},
			[]string{"remote_address=10.0.0.2", "tenant=t1", "gray=true"}},
		{"x-canary other than true", httpRequest{remote: "10.0.0.2", path: "/", headers: map[string]string{"x-canary": "yes"}},
			[]string{"remote_address=10.0.0.2"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := descriptorStrings(e.descriptors(t, tc.req))
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Errorf("descriptors for %+v:\n got %q\nwant %q", tc.req, got, tc.want)
			}
		})
	}
}

// envoyClient plays Envoy: it turns requests into descriptors with the
// example's actions and asks a running sluice.
type envoyClient struct {
	e *envoyExample
	p *rlsProcess
}

// check asks sluice about one request, as the ratelimit filter would. A
// request without descriptors is allowed without a call (nil response).
func (c envoyClient) check(t *testing.T, req httpRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	ds := c.e.descriptors(t, req)
	if len(ds) == 0 {
		return nil
	}
	resp, err := c.p.Client.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: c.e.filter.GetDomain(), Descriptors: ds})
	if err != nil {
		t.Fatalf("ShouldRateLimit(%q): %v", descriptorStrings(ds), err)
	}
	return resp
}

// envoyAllows reports whether Envoy lets a request through on resp.
func envoyAllows(resp *rlsv3.RateLimitResponse) bool {
	return resp == nil || resp.GetOverallCode() == rlsv3.RateLimitResponse_OK
}

// run sends n requests (req(i) builds the i-th) as fast as it can and
// returns how many were allowed, the last refusal and how long the run took.
func (c envoyClient) run(t *testing.T, n int, req func(i int) httpRequest) (ok int, refusal *rlsv3.RateLimitResponse, elapsed time.Duration) {
	t.Helper()
	start := time.Now()
	for i := range n {
		if resp := c.check(t, req(i)); envoyAllows(resp) {
			ok++
		} else {
			refusal = resp
		}
	}
	return ok, refusal, time.Since(start)
}

// runUntilRefused sends requests (req(i) builds the i-th) from 8
// concurrent callers until one is refused or most were sent, and returns
// how many were allowed, the first refusal and how long the run took. It
// is for runs whose refusal is checked: a fixed number of serial requests
// took longer on a loaded machine than the bucket needs to refill them (70
// on a bucket of 50 refilling 50/s got no refusal), while 8 callers offer
// several times the rules' rates however slowly each is answered.
func (c envoyClient) runUntilRefused(t *testing.T, most int, req func(i int) httpRequest) (ok int, refusal *rlsv3.RateLimitResponse, elapsed time.Duration) {
	t.Helper()
	var (
		mu      sync.Mutex
		next    int
		callErr error
		wg      sync.WaitGroup
	)
	start := time.Now()
	for range 8 {
		wg.Go(func() {
			for {
				mu.Lock()
				if refusal != nil || callErr != nil || next >= most {
					mu.Unlock()
					return
				}
				r := req(next)
				next++
				mu.Unlock()
				var resp *rlsv3.RateLimitResponse
				var err error
				if ds := c.e.descriptors(t, r); len(ds) > 0 {
					resp, err = c.p.Client.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: c.e.filter.GetDomain(), Descriptors: ds})
				}
				mu.Lock()
				switch {
				case err != nil:
					callErr = fmt.Errorf("ShouldRateLimit(%+v): %w", r, err)
				case envoyAllows(resp):
					ok++
				case refusal == nil:
					refusal = resp
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed = time.Since(start)
	if callErr != nil {
		t.Fatal(callErr)
	}
	if refusal == nil {
		t.Fatalf("no refusal in %d requests (%d allowed) over %v", most, ok, elapsed)
	}
	return ok, refusal, elapsed
}

// checkBucketRun checks a run against a token bucket of burst tokens refilling
// at rate per second: it admits the full burst, and no more than the
// tokens that can have dripped in during the run.
func checkBucketRun(t *testing.T, what string, ok, burst int, rate float64, elapsed time.Duration) {
	t.Helper()
	most := burst + int(math.Ceil(rate*elapsed.Seconds()))
	if ok < burst || ok > most {
		t.Errorf("%s: %d allowed in %v, want %d (the burst) to %d (plus %v/s of refill)", what, ok, elapsed, burst, most, rate)
	}
}

// responseHeader returns a header sluice asks Envoy to add, or "".
func responseHeader(resp *rlsv3.RateLimitResponse, key string) string {
	for _, h := range resp.GetResponseHeadersToAdd() {
		if strings.EqualFold(h.GetKey(), key) {
			return h.GetValue()
		}
	}
	return ""
}

// exampleAddr returns the i-th client address of a block: a fresh
// address per request, so per-address limits stay out of the way.
func exampleAddr(block, i int) string { return fmt.Sprintf("10.%d.%d.%d", block, i/250, i%250+1) }

// TestExampleEnvoyPromises checks every promise in envoy.yaml's header
// against a real sluice, on the embedded example rules and on the
// Kubernetes example's ConfigMap, which promise the same limits.
func TestExampleEnvoyPromises(t *testing.T) {
	t.Parallel()
	e := loadEnvoyExample(t)
	sources := []struct {
		name string
		args func(t *testing.T) []string
	}{
		{"embedded rules", func(*testing.T) []string { return nil }},
		{"kubernetes ConfigMap", func(t *testing.T) []string { return []string{"--config", configMapRules(t)} }},
	}
	for _, src := range sources {
		t.Run(src.name, func(t *testing.T) {
			t.Parallel()
			p := startRLS(t, src.args(t)...)
			checkEnvoyPromises(t, envoyClient{e, p})
		})
	}
}

// configMapRules writes the rule files of the Kubernetes example's
// ConfigMap into a directory, as the kubelet mounts them, and returns it.
func configMapRules(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("../envoy-examples/kubernetes/configmap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Data map[string]string `yaml:"data"`
	}
	if err := yaml.Unmarshal(data, &cm); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, content := range cm.Data {
		writeFile(t, dir, name, content)
	}
	if len(cm.Data) == 0 {
		t.Fatal("ConfigMap has no data")
	}
	return dir
}

func checkEnvoyPromises(t *testing.T, c envoyClient) {
	user := func(remote, path, id string) httpRequest {
		return httpRequest{remote: remote, path: path, headers: map[string]string{"x-user-id": id}}
	}

	t.Run("50.0.0.5 is always refused", func(t *testing.T) {
		for _, req := range []httpRequest{
			{remote: "50.0.0.5", path: "/"},
			user("50.0.0.5", "/api/orders/1", "blocked-user"),
			{remote: "50.0.0.5", path: "/", headers: map[string]string{"x-canary": "true"}},
		} {
			if resp := c.check(t, req); envoyAllows(resp) {
				t.Errorf("%+v: allowed, want refused", req)
			}
		}
	})

	t.Run("healthz is never limited, not even for 50.0.0.5", func(t *testing.T) {
		ok, _, _ := c.run(t, 100, func(int) httpRequest { return httpRequest{remote: "50.0.0.5", path: "/healthz"} })
		if ok != 100 {
			t.Errorf("%d of 100 health checks allowed", ok)
		}
	})

	t.Run("an address: 50/s, bursts of 20, per node", func(t *testing.T) {
		ok, refusal, elapsed := c.runUntilRefused(t, 1000, func(int) httpRequest { return httpRequest{remote: "10.200.0.1", path: "/"} })
		checkBucketRun(t, "one address", ok, 20, 50, elapsed)
		if got := responseHeader(refusal, "x-ratelimit-layer"); got != "local" {
			t.Errorf("refused by layer %q, want local (the per-node limit)", got)
		}
		// The fleet-wide half of the promise is the rule's global layer,
		// which one node cannot exhaust before its local burst: check it
		// is configured as promised.
		if code, body := c.p.HTTPGet(t, "/rlconfig"); code != http.StatusOK ||
			!strings.Contains(body, "edge.remote_address: global 100/second burst 200, local 50/second burst 20\n") {
			t.Errorf("/rlconfig = %d %q, want edge.remote_address with global 100/s burst 200, local 50/s burst 20", code, body)
		}
	})

	t.Run("a canary address bursts to 40", func(t *testing.T) {
		ok, refusal, elapsed := c.runUntilRefused(t, 1000, func(int) httpRequest {
			return httpRequest{remote: "10.200.0.2", path: "/", headers: map[string]string{"x-canary": "true"}}
		})
		checkBucketRun(t, "one canary address", ok, 40, 100, elapsed)
		if got := responseHeader(refusal, "x-ratelimit-gray"); got != "true" {
			t.Errorf("refusal header x-ratelimit-gray = %q, want true", got)
		}
	})

	t.Run("a user: 10/s, bursts of 20", func(t *testing.T) {
		ok, refusal, elapsed := c.runUntilRefused(t, 1000, func(i int) httpRequest { return user(exampleAddr(1, i), "/", "user-1") })
		checkBucketRun(t, "one user from many addresses", ok, 20, 10, elapsed)
		if got := responseHeader(refusal, "x-ratelimit-layer"); got != "global" {
			t.Errorf("refused by layer %q, want global", got)
		}
	})

	t.Run("orders: 2/s, bursts of 5, per user, instead of the per-user limit", func(t *testing.T) {
		// Every order ID, one budget.
		ok, _, elapsed := c.run(t, 15, func(i int) httpRequest { return user(exampleAddr(2, i), "/api/orders/"+strconv.Itoa(i), "user-2") })
		checkBucketRun(t, "one user on /api/orders", ok, 5, 2, elapsed)

		resp := c.check(t, user(exampleAddr(2, 100), "/api/orders/100", "user-3"))
		ds := descriptorStrings(c.e.descriptors(t, user(exampleAddr(2, 100), "/api/orders/100", "user-3")))
		for i, st := range resp.GetStatuses() {
			switch {
			case strings.HasPrefix(ds[i], "route="):
				if n := st.GetCurrentLimit().GetName(); n != "orders_per_user" {
					t.Errorf("%s: limit %q, want orders_per_user", ds[i], n)
				}
			case strings.HasPrefix(ds[i], "user_id="):
				if l := st.GetCurrentLimit(); l != nil {
					t.Errorf("%s: limited by %v, want the per-user rule replaced", ds[i], l)
				}
			}
		}
		// Replaced means not counted: user-2's per-user budget is whole.
		ok, _, elapsed = c.run(t, 30, func(i int) httpRequest { return user(exampleAddr(3, i), "/", "user-2") })
		checkBucketRun(t, "user-2 off /api/orders", ok, 20, 10, elapsed)
	})

	t.Run("a tenant: 50/s per node", func(t *testing.T) {
		ok, refusal, elapsed := c.runUntilRefused(t, 1000, func(i int) httpRequest {
			return httpRequest{remote: exampleAddr(4, i), path: "/", headers: map[string]string{"x-tenant-id": "tenant-1"}}
		})
		checkBucketRun(t, "one tenant", ok, 50, 50, elapsed)
		if got := responseHeader(refusal, "x-ratelimit-layer"); got != "local" {
			t.Errorf("refused by layer %q, want local (no Redis)", got)
		}
	})

	// The blocklist rule refuses every request under its own rule label (a
	// refusal ratio of 1, which the alert SluiceRuleTooTight leaves out).
	t.Run("blocklist rule label", func(t *testing.T) {
		_, body := c.p.HTTPGet(t, "/metrics")
		re := regexp.MustCompile(`(?m)^ratelimit_decisions_total\{[^}]*result="over_limit"[^}]*rule="edge\.remote_address_50\.0\.0\.5"[^}]*\} [1-9]`)
		if !re.MatchString(body) {
			t.Errorf("/metrics has no over_limit decisions for rule edge.remote_address_50.0.0.5")
		}
	})
}
