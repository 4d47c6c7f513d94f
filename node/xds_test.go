package node

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-rls/sluice/internal/pkitest"
	"github.com/sluice-rls/sluice/internal/xdstest"
)

// Envoy Gateway's shape: one RateLimitConfig per listener, its domain the
// listener's name, a route descriptor holding one descriptor per rule.
const (
	egDomain = "default/eg/http"
	egRoute  = "httproute/default/backend/rule/0"
	egRule   = "httproute/default/backend/rule/0/match/-1"
)

func egConfig(rpu uint32, unit rlsconfv3.RateLimitUnit) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{
		Name:   egDomain,
		Domain: egDomain,
		Descriptors: []*rlsconfv3.RateLimitDescriptor{{
			Key: egRoute, Value: egRoute,
			Descriptors: []*rlsconfv3.RateLimitDescriptor{{
				Key: egRule, Value: egRule,
				RateLimit: &rlsconfv3.RateLimitPolicy{Unit: unit, RequestsPerUnit: rpu},
			}},
		}},
	}
}

// TestServeFromXDS runs a node on rules from a real management server over
// mTLS, as Envoy Gateway deploys it: no rules and not ready until the
// first update, then the update decides, /rlconfig and the metrics show
// its version, and a bad update is NACKed while the running rules keep
// deciding.
func TestServeFromXDS(t *testing.T) {
	pki := pkitest.New(t)
	mgmt := xdstest.Start(t, "", grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{pki.Server},
		ClientCAs:    pki.Roots,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	})))
	opts := testOptions()
	opts.XDS.Server, opts.XDS.NodeID = mgmt.Addr, "envoy-ratelimit"
	opts.XDS.TLSCA, opts.XDS.TLSCert, opts.XDS.TLSKey, opts.XDS.TLSServerName = pki.CA, pki.ClientCert, pki.ClientKey, pkitest.ServerName
	srv := start(t, opts)
	line := srv.Serving()
	httpBase := srv.HTTP()
	if line["rules"] != "xds://"+mgmt.Addr || line["rule_count"] != float64(0) {
		t.Errorf("serving line: rules %v, rule_count %v; want xds://%s and 0", line["rules"], line["rule_count"], mgmt.Addr)
	}
	conn := dial(t, srv.Addrs().GRPC.String())
	rls := rlsv3.NewRateLimitServiceClient(conn)
	decide := func() rlsv3.RateLimitResponse_Code {
		t.Helper()
		resp, err := rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: egDomain, Descriptors: []*commonv3.RateLimitDescriptor{{
			Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: egRoute, Value: egRoute}, {Key: egRule, Value: egRule}},
		}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode()
	}
	health := func() healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		resp, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: "ratelimit"})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetStatus()
	}

	// Before the first update: no rules, not ready.
	if code, body := httpGet(t, httpBase+"/healthcheck"); code != http.StatusServiceUnavailable || !strings.Contains(body, "waiting for the first rules from the xDS server") {
		t.Errorf("/healthcheck before the first update: %d %q, want 503 waiting", code, body)
	}
	if got := health(); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health before the first update: %v, want NOT_SERVING", got)
	}
	if got := decide(); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("decision before the first update: %v, want OK (no rules)", got)
	}

	// The first update: a limit of 0 refuses every request.
	mgmt.Set(t, "envoy-ratelimit", "v1", egConfig(0, rlsconfv3.RateLimitUnit_SECOND))
	mgmt.WaitRequest(t, xdstest.ACK("v1"))
	if code, body := httpGet(t, httpBase+"/healthcheck"); code != http.StatusOK {
		t.Errorf("/healthcheck after the first update: %d %q, want 200", code, body)
	}
	if got := health(); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC health after the first update: %v, want SERVING", got)
	}
	if got := decide(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("decision on v1: %v, want OVER_LIMIT", got)
	}
	_, rlconfig := httpGet(t, httpBase+"/rlconfig")
	if first, _, _ := strings.Cut(rlconfig, "\n"); first != "# version: v1 source: xds" {
		t.Errorf("/rlconfig starts with %q, want the version line:\n%s", first, rlconfig)
	}
	if !strings.Contains(rlconfig, egRule) {
		t.Errorf("/rlconfig lacks the rule %s:\n%s", egRule, rlconfig)
	}
	if _, metrics := httpGet(t, httpBase+"/metrics"); !strings.Contains(metrics, `ratelimit_config_info{source="xds",version="v1"} 1`) ||
		!strings.Contains(metrics, "ratelimit_xds_connected 1") {
		t.Errorf("/metrics lacks the xDS version or connection:\n%s", grepLines(metrics, "xds"))
	}

	// A bad update (no unit) is NACKed with its reason; v1 keeps deciding.
	mgmt.Set(t, "envoy-ratelimit", "v2", egConfig(1000, rlsconfv3.RateLimitUnit_UNKNOWN))
	nack := mgmt.WaitRequest(t, xdstest.NACK)
	if msg := nack.GetErrorDetail().GetMessage(); !strings.Contains(msg, "xds:"+egDomain+":") || !strings.Contains(msg, "has requests_per_unit but no unit") {
		t.Errorf("NACK error detail %q, want the resource and the reason", msg)
	}
	if got := decide(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("decision after the bad update: %v, want v1's OVER_LIMIT", got)
	}
	if _, rlconfig := httpGet(t, httpBase+"/rlconfig"); !strings.HasPrefix(rlconfig, "# version: v1 source: xds\n") {
		t.Errorf("/rlconfig after the bad update:\n%s\nwant version v1", rlconfig)
	}

	srv.StopCleanly()
}

// TestServeXDSUpdateOverMaxRuleBytes: an xDS response larger than
// MaxRuleBytes (--max-rule-bytes) is refused by gRPC (the stream fails and sluice
// reconnects, keeping its rules), and a smaller update is then applied.
func TestServeXDSUpdateOverMaxRuleBytes(t *testing.T) {
	mgmt := xdstest.Start(t, "")
	big := egConfig(1, rlsconfv3.RateLimitUnit_SECOND)
	for i := range 100 {
		v := fmt.Sprintf("value-%03d-%s", i, strings.Repeat("x", 40))
		big.Descriptors = append(big.Descriptors, &rlsconfv3.RateLimitDescriptor{Key: "k", Value: v,
			RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 1}})
	}
	mgmt.Set(t, "default", "big", big)
	opts := testOptions()
	opts.XDS.Server, opts.MaxRuleBytes = mgmt.Addr, 2000
	opts.XDS.BackoffMin, opts.XDS.BackoffMax = 10*time.Millisecond, 20*time.Millisecond
	srv := start(t, opts)
	httpBase := srv.HTTP()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(srv.Log.String(), "larger than max") {
		if time.Now().After(deadline) {
			t.Fatalf("no refusal of the large update:\n%s", srv.Log.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if code, _ := httpGet(t, httpBase+"/healthcheck"); code != http.StatusServiceUnavailable {
		t.Errorf("/healthcheck after the large update only: %d, want 503", code)
	}
	mgmt.Set(t, "default", "small", egConfig(1, rlsconfv3.RateLimitUnit_SECOND))
	mgmt.WaitRequest(t, xdstest.ACK("small"))
	if _, rlconfig := httpGet(t, httpBase+"/rlconfig"); !strings.HasPrefix(rlconfig, "# version: small source: xds\n") {
		t.Errorf("/rlconfig:\n%s\nwant version small", rlconfig)
	}
	srv.StopCleanly()
}

// TestServeXDSLimits: XDS.MaxDepth and XDS.MaxResources reach the xDS
// source: an update over either is NACKed naming the flag, before it
// is rendered, and the running rules stay; one within them is applied.
func TestServeXDSLimits(t *testing.T) {
	mgmt := xdstest.Start(t, "")
	mgmt.Set(t, "default", "v1", egConfig(1, rlsconfv3.RateLimitUnit_SECOND)) // two levels
	opts := testOptions()
	opts.XDS.Server, opts.XDS.MaxDepth, opts.XDS.MaxResources = mgmt.Addr, 2, 1
	opts.XDS.BackoffMin, opts.XDS.BackoffMax = 10*time.Millisecond, 20*time.Millisecond
	srv := start(t, opts)
	mgmt.WaitRequest(t, xdstest.ACK("v1"))

	deep := egConfig(1, rlsconfv3.RateLimitUnit_SECOND)
	deep.Descriptors[0].Descriptors[0].Descriptors = []*rlsconfv3.RateLimitDescriptor{{Key: "third"}}
	mgmt.Set(t, "default", "deep", deep)
	if msg := mgmt.WaitRequest(t, xdstest.NACK).GetErrorDetail().GetMessage(); !strings.Contains(msg, "nested more than 2 levels deep (--xds-max-depth)") {
		t.Errorf("NACK of a 3-level update: %q, want --xds-max-depth", msg)
	}
	two := egConfig(1, rlsconfv3.RateLimitUnit_SECOND)
	two.Name, two.Domain = "other", "other"
	mgmt.Set(t, "default", "two", egConfig(1, rlsconfv3.RateLimitUnit_SECOND), two)
	// The NACKs of "deep" (sent again by the server) come first.
	nackOf := func(version string) func(*discovery.DiscoveryRequest) bool {
		return func(r *discovery.DiscoveryRequest) bool {
			return xdstest.NACK(r) && strings.Contains(r.GetErrorDetail().GetMessage(), fmt.Sprintf("version %q", version))
		}
	}
	if msg := mgmt.WaitRequest(t, nackOf("two")).GetErrorDetail().GetMessage(); !strings.Contains(msg, "update holds 2 resources, more than the 1 allowed (--xds-max-resources)") {
		t.Errorf("NACK of a 2-resource update: %q, want --xds-max-resources", msg)
	}
	if _, rlconfig := httpGet(t, srv.HTTP()+"/rlconfig"); !strings.HasPrefix(rlconfig, "# version: v1 source: xds\n") {
		t.Errorf("/rlconfig after the refused updates:\n%s\nwant version v1", rlconfig)
	}
	srv.StopCleanly()
}
