package node

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-rls/sluice/audit/redisaudit"
	"github.com/sluice-rls/sluice/backend/lease"
	"github.com/sluice-rls/sluice/backend/memory"
	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/fallback"
	"github.com/sluice-rls/sluice/internal/logtest"
	"github.com/sluice-rls/sluice/override"
	"github.com/sluice-rls/sluice/ruleset"
	"github.com/sluice-rls/sluice/service"
	"github.com/sluice-rls/sluice/xds"
)

// testOptions are the options of `rls serve` with its flags' defaults,
// but for gRPC and HTTP on free loopback ports and no admin listener.
func testOptions() Options {
	return Options{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Rules: Rules{MaxRuleBytes: ruleset.DefaultMaxRuleBytes, GrayKey: service.DefaultGrayKey},
		XDS: XDS{
			NodeID: xds.DefaultNodeID, BackoffMin: xds.DefaultBackoffMin, BackoffMax: xds.DefaultBackoffMax,
			MaxResources: xds.DefaultMaxResources, MaxDescriptors: xds.DefaultMaxDescriptors, MaxDepth: xds.DefaultMaxDepth,
		},
		Overrides:        Overrides{Resync: override.DefaultResync, MaxExpiry: override.DefaultMaxLoosenExpiry},
		HTTPReadTimeout:  5 * time.Second,
		HTTPWriteTimeout: 10 * time.Second, HTTPIdleTimeout: 30 * time.Second, HTTPMaxConns: 128,
		GRPCHandshakeTimeout: 5 * time.Second, GRPCMaxConnIdle: 2 * time.Minute, GRPCMaxConnAge: time.Hour,
		GRPCMaxConnAgeGrace: 10 * time.Second, GRPCKeepaliveMinTime: 10 * time.Second,
		GRPCMaxConns: 4096, GRPCFirstCallTimeout: 5 * time.Second,
		RedisTimeout: redisbackend.DefaultTimeout, RedisFailure: fallback.Share,
		Consistency: lease.DefaultConsistency, LeasePeriod: lease.DefaultPeriod,
		Settings: service.Settings{
			HeaderLimit: service.DefaultHeaderLimit, HeaderRemaining: service.DefaultHeaderRemaining, HeaderReset: service.DefaultHeaderReset,
			MaxDescriptors: service.DefaultMaxDescriptors, MaxEntries: service.DefaultMaxEntries, MaxValueBytes: service.DefaultMaxValueBytes,
			MaxMetricValues: service.DefaultMaxMetricValues, MaxTenants: service.DefaultMaxTenants, RefusalLogEvery: 100, TopRefused: service.DefaultTopRefused,
		},
		MaxBuckets:         memory.DefaultMaxBuckets,
		DrainTimeout:       10 * time.Second,
		TracingSampleRatio: DefaultTracingSampleRatio,
		Audit:              Audit{Stream: redisaudit.DefaultStream, MaxLen: redisaudit.DefaultMaxLen},
	}
}

// stopWithin bounds how long Run may take to return after its context is
// cancelled.
const stopWithin = 15 * time.Second

// running is a node a test runs until Stop, or the test's end; Log holds
// its log lines, in JSON.
type running struct {
	t       *testing.T
	node    *Node
	Log     *logtest.Buffer
	cancel  context.CancelFunc
	done    chan error
	stopped bool
}

// start runs the node of opts (its Logger set to Log) until Stop, or the
// test's end; options New refuses fail the test.
func start(t *testing.T, opts Options) *running {
	t.Helper()
	r := &running{t: t, Log: &logtest.Buffer{}, done: make(chan error, 1)}
	opts.Logger = slog.New(slog.NewJSONHandler(r.Log, nil))
	n, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	r.node = n
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- n.Run(ctx) }()
	t.Cleanup(func() {
		if r.stopped {
			return
		}
		cancel()
		select {
		case <-r.done:
		case <-time.After(stopWithin):
			t.Errorf("Run did not return after cancel")
		}
	})
	return r
}

// Addrs waits until the node serves and returns its addresses.
func (r *running) Addrs() Addrs {
	r.t.Helper()
	select {
	case <-r.node.Ready():
		return r.node.Addrs()
	case err := <-r.done:
		r.done <- err // for Stop
	case <-time.After(10 * time.Second):
	}
	r.t.Fatalf("not serving:\n%s", r.Log.String())
	return Addrs{}
}

// Client dials the gRPC address in plaintext; the connection closes at
// the test's end.
func (r *running) Client() rlsv3.RateLimitServiceClient {
	r.t.Helper()
	return rlsv3.NewRateLimitServiceClient(dial(r.t, r.Addrs().GRPC.String()))
}

// HTTP is the base URL of the HTTP address.
func (r *running) HTTP() string {
	r.t.Helper()
	return "http://" + r.Addrs().HTTP.String()
}

// Stop cancels Run's context and returns what Run returned; Run not
// returning within stopWithin fails the test.
func (r *running) Stop() error {
	r.t.Helper()
	r.cancel()
	r.stopped = true // the cleanup would only wait again
	select {
	case err := <-r.done:
		return err
	case <-time.After(stopWithin):
		r.t.Fatal("Run did not return after cancel")
		return nil
	}
}

// StopCleanly is Stop, failing the test unless Run returned nil.
func (r *running) StopCleanly() {
	r.t.Helper()
	if err := r.Stop(); err != nil {
		r.t.Errorf("Run returned %v after cancel, want nil", err)
	}
}

// Serving waits for the node's "serving" log line and returns it.
func (r *running) Serving() map[string]any {
	r.t.Helper()
	r.Addrs()
	deadline := time.Now().Add(10 * time.Second) // the line follows Ready
	for time.Now().Before(deadline) {
		for _, line := range strings.Split(r.Log.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "serving" {
				return m
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	r.t.Fatalf("no serving line:\n%s", r.Log.String())
	return nil
}

// runErr runs the node of opts and returns Run's error, which the test
// expects: a node that serves instead fails the test.
func runErr(t *testing.T, opts Options) error {
	t.Helper()
	n, err := New(opts)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	select {
	case err := <-done:
		return err
	case <-n.Ready():
		cancel()
		<-done
		t.Fatal("the node serves, want an error")
		return nil
	}
}

// dial dials addr in plaintext; the connection closes at the test's end.
func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// edgeRequest is a request of one descriptor of one entry, key=value, in
// the example rules' domain "edge".
func edgeRequest(key, value string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{{
		Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: key, Value: value}},
	}}}
}

// httpGet GETs url and returns the status and body.
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestEmbeddedRulesGauge(t *testing.T) {
	for _, embedded := range []bool{true, false} {
		reg := prometheus.NewRegistry()
		registerEmbeddedRules(reg, embedded)
		want := 0.0
		if embedded {
			want = 1
		}
		mfs, err := reg.Gather()
		if err != nil || len(mfs) != 1 || mfs[0].GetName() != "ratelimit_config_embedded" {
			t.Fatalf("gathered %v, %v", mfs, err)
		}
		if got := mfs[0].GetMetric()[0].GetGauge().GetValue(); got != want {
			t.Errorf("embedded %v: gauge %v, want %v", embedded, got, want)
		}
	}
}

// TestNodeServesAndDrains: a node from whole Options (no flags) on :0
// ports reports its listeners once Ready, answers health on gRPC and
// /healthcheck on HTTP, and Run returns nil when its context ends.
func TestNodeServesAndDrains(t *testing.T) {
	n, err := New(Options{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", AdminAddr: "127.0.0.1:0",
		Rules:                Rules{MaxRuleBytes: ruleset.DefaultMaxRuleBytes},
		Overrides:            Overrides{Resync: time.Second, MaxExpiry: time.Hour},
		Audit:                Audit{MaxLen: 10},
		RedisTimeout:         time.Second,
		LeasePeriod:          time.Second,
		GRPCHandshakeTimeout: time.Second,
		Settings: service.Settings{
			HeaderLimit: "RateLimit-Limit", HeaderRemaining: "RateLimit-Remaining", HeaderReset: "RateLimit-Reset",
			MaxDescriptors: 8, MaxEntries: 8, MaxValueBytes: 64, MaxMetricValues: 10, MaxTenants: 10,
		},
		MaxBuckets:   1000,
		DrainTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	select {
	case <-n.Ready():
	case err := <-done:
		t.Fatalf("Run returned before serving: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("not ready")
	}
	a := n.Addrs()
	if a.Admin == nil || a.GRPC.(*net.TCPAddr).Port == 0 {
		t.Errorf("Addrs() = %+v, want the bound ports and an admin address", a)
	}
	conn := dial(t, a.GRPC.String())
	hc, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: healthServiceName})
	if err != nil || hc.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC health: %v, %v; want SERVING", hc, err)
	}
	resp, err := http.Get("http://" + a.HTTP.String() + "/healthcheck")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthcheck: %d, want 200", resp.StatusCode)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run after cancel: %v, want nil", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}
