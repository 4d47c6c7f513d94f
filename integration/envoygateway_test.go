//go:build integration

package integration

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protojson"
	"gopkg.in/yaml.v3"

	"github.com/sluice-rls/sluice/internal/egtest"
	"github.com/sluice-rls/sluice/internal/pkitest"
	"github.com/sluice-rls/sluice/internal/redistest"
	"github.com/sluice-rls/sluice/internal/xdstest"
)

// TestEnvoyGatewaySwap runs the built rls as Envoy Gateway runs its
// rate-limit container once the image is swapped for sluice's: its command
// (/bin/ratelimit, no arguments) and its environment, changed only where
// they name places of a cluster: the certificate files (a test PKI, one
// certificate that serves and authenticates, as Envoy Gateway's), Redis (a
// real redis-server), the xDS server (a real go-control-plane server over
// mTLS, serving what Envoy Gateway's translator builds) and the listeners
// (free loopback ports). To that it adds statsd, as an operator patching
// the Deployment's env would. It is ready before the first update (as the
// peer with FORCE_START_WITHOUT_INITIAL_CONFIG=true), ACKs the update,
// limits per the served config through Redis over TLS, and sends the
// peer's statsd counters.
func TestEnvoyGatewaySwap(t *testing.T) {
	c := egtest.Load(t)
	pki := pkitest.New(t)
	leaf := pki.IssueServerClient(t)
	mgmt := xdstest.Start(t, "", grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{pki.Server},
		ClientCAs:    pki.Roots,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	})))
	redis := redistest.Start(t)
	statsd, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer statsd.Close()

	places := map[string]string{
		"/certs/tls.crt": leaf.Cert, "/certs/tls.key": leaf.Key, "/certs/ca.crt": pki.CA,
		"envoy-gateway:18001": mgmt.Addr, "redis.redis.svc:6379": redis.Addr(),
		":19001": "127.0.0.1:0", // PROMETHEUS_ADDR, where its annotations scrape
	}
	set := map[string]string{
		"USE_STATSD": "true", "STATSD_HOST": "127.0.0.1", "STATSD_PORT": strconv.Itoa(statsd.LocalAddr().(*net.UDPAddr).Port), "STATS_FLUSH_INTERVAL": "100ms",
	}
	env := []string{
		"RLS_PEER_ENV=map", // the default, which rlsEnv turns off for the other tests
		"RLS_GRPC_ADDR=127.0.0.1:0", "RLS_HTTP_ADDR=127.0.0.1:0", "RLS_ADMIN_ADDR=127.0.0.1:0",
		// Not a peer setting: a busy machine must not send the node to its
		// fallback (10ms by default), whose share would refuse sooner.
		"RLS_REDIS_TIMEOUT=2s",
	}
	for _, e := range c.Env {
		v, ok := places[e.Value]
		if !ok {
			v = e.Value
		}
		if s, ok := set[e.Name]; ok {
			v = s
			delete(set, e.Name)
		}
		env = append(env, e.Name+"="+v)
	}
	for k, v := range set {
		env = append(env, k+"="+v)
	}
	cmd := exec.Command(rlsBinary, c.Args...)
	cmd.Args[0] = c.Command[0] // what the process is called: /bin/ratelimit
	cmd.Env = rlsEnv(env...)
	p := startCmd(t, cmd)

	// Ready before the first update, answering OK, over TLS.
	if status, body := p.HTTPGet(t, "/healthcheck"); status != http.StatusOK {
		t.Errorf("/healthcheck before the first update: %d %q, want 200", status, body)
	}
	conn := pki.DialGRPC(t, p.GRPCAddr, tls.Certificate{})
	health, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: "ratelimit"})
	if err != nil || health.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC health before the first update: %v, %v; want SERVING", health.GetStatus(), err)
	}
	client := rlsv3.NewRateLimitServiceClient(conn)
	decide := func(route string) rlsv3.RateLimitResponse_Code {
		t.Helper()
		resp, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "first-listener", Descriptors: []*commonv3.RateLimitDescriptor{{
			Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: route, Value: route}, {Key: "rule-0-match-0", Value: "rule-0-match-0"}},
		}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode()
	}
	if got := decide("second-route"); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("before the first update: %v, want OK", got)
	}

	// Envoy Gateway's update, for the node id of its env: ACKed, then it
	// limits (5 a month on first-route, 1 a year on second-route).
	mgmt.Set(t, "envoy-ratelimit", "v1", envoyGatewayConfig(t))
	mgmt.WaitRequest(t, xdstest.ACK("v1"))
	for route, limit := range map[string]int{"first-route": 5, "second-route": 1} {
		for i := range limit {
			if got := decide(route); got != rlsv3.RateLimitResponse_OK {
				t.Errorf("%s request %d: %v, want OK", route, i+1, got)
			}
		}
		if got := decide(route); got != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("%s request %d: %v, want OVER_LIMIT", route, limit+1, got)
		}
	}
	rc := goredis.NewClient(&goredis.Options{Addr: redis.Addr()})
	defer rc.Close()
	keys, err := rc.Keys(context.Background(), "sluice:*").Result()
	buckets := slices.DeleteFunc(keys, func(k string) bool { return !bucketKey.MatchString(k) })
	if err != nil || len(buckets) != 2 {
		t.Errorf("sluice keys in Redis: %v, %v; want the two routes' buckets", keys, err)
	}

	// Prometheus on PROMETHEUS_ADDR, where Envoy Gateway's pod annotations
	// and Service point: sluice's series.
	if p.MetricsAddr == "off" {
		t.Fatal("no metrics listener for USE_PROMETHEUS=true, PROMETHEUS_ADDR=:19001")
	}
	resp, err := http.Get("http://" + p.MetricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if wantSeries := `ratelimit_requests_total{code="over_limit",domain="first-listener"} 2`; resp.StatusCode != http.StatusOK || !strings.Contains(string(metrics), wantSeries) {
		t.Errorf("PROMETHEUS_ADDR /metrics: %d, want 200 with %s", resp.StatusCode, wantSeries)
	}

	// statsd: the peer's names; the counters may come over several sends.
	const first = "ratelimit.service.rate_limit.first-listener.first-route_first-route.rule-0-match-0_rule-0-match-0."
	const second = "ratelimit.service.rate_limit.first-listener.second-route_second-route.rule-0-match-0_rule-0-match-0."
	want := map[string]int{
		first + "total_hits": 6, first + "within_limit": 5, first + "over_limit": 1,
		second + "total_hits": 2, second + "within_limit": 1, second + "over_limit": 1,
		"ratelimit.service.config_load_success": 1,
	}
	got := map[string]int{}
	buf := make([]byte, 64*1024)
	deadline := time.Now().Add(10 * time.Second)
	for !reached(got, want) {
		if err := statsd.SetReadDeadline(deadline); err != nil {
			t.Fatal(err)
		}
		n, err := statsd.Read(buf)
		if err != nil {
			t.Fatalf("statsd: %v; got %v, want %v", err, got, want)
		}
		for _, line := range strings.Fields(string(buf[:n])) {
			name, rest, _ := strings.Cut(line, ":")
			v, _, _ := strings.Cut(rest, "|")
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("statsd line %q", line)
			}
			got[name] += n
		}
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("statsd %s: %d, want %d", k, got[k], v)
		}
	}

	log := p.Log()
	for _, bad := range []string{"level=ERROR", "ignored (--peer-env=ignore)"} {
		if strings.Contains(log, bad) {
			t.Errorf("log has %q:\n%s", bad, log)
		}
	}
	for _, line := range []string{`flag=--xds-ready-before-rules value="\"true\""`, "flag=--statsd-addr", "flag=--tls-cert", "flag=--xds-tls-cert"} {
		if !strings.Contains(log, line) {
			t.Errorf("log lacks %s:\n%s", line, log)
		}
	}
}

// bucketKey is the Redis key of a bucket (not the audit stream or the
// node registry).
var bucketKey = regexp.MustCompile(`^sluice:\{[0-9a-f]{32}\}$`)

// reached reports whether got has every count of want.
func reached(got, want map[string]int) bool {
	for k, v := range want {
		if got[k] < v {
			return false
		}
	}
	return true
}

// envoyGatewayConfig reads testdata/envoy-gateway-ratelimit-config.yaml,
// the resource in YAML with Envoy Gateway's unit names, into its proto.
func envoyGatewayConfig(t *testing.T) *rlsconfv3.RateLimitConfig {
	t.Helper()
	b, err := os.ReadFile("testdata/envoy-gateway-ratelimit-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	unitsByNumber(doc)
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var cfg rlsconfv3.RateLimitConfig
	if err := protojson.Unmarshal(js, &cfg); err != nil {
		t.Fatal(err)
	}
	return &cfg
}

// unitsByNumber replaces the unit names in doc by their numbers in Envoy
// Gateway's proto (envoy ratelimit/config/ratelimit/v3/rls_conf.proto),
// which has MONTH, YEAR and WEEK that sluice's published module does not
// name: on the wire a unit is its number.
func unitsByNumber(doc any) {
	units := map[string]int{"SECOND": 1, "MINUTE": 2, "HOUR": 3, "DAY": 4, "MONTH": 5, "YEAR": 6, "WEEK": 7}
	switch v := doc.(type) {
	case map[string]any:
		for k, x := range v {
			if name, ok := x.(string); ok && k == "unit" {
				v[k] = units[name]
				continue
			}
			unitsByNumber(x)
		}
	case []any:
		for _, x := range v {
			unitsByNumber(x)
		}
	}
}
