package node

import (
	"context"
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"

	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/internal/pkitest"
	"github.com/sluice-rls/sluice/internal/redistest"
)

// TestFallbackNodes: N is never 1 just because the node has not reached
// Redis. Before the first heartbeat it is --fallback-nodes-initial, or 10;
// after it the registry's count, kept while Redis is down; --fallback-nodes
// pins it throughout. ratelimit_fallback_nodes shows N under its source.
func TestFallbackNodes(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tests := []struct {
		name            string
		pinned, initial int
		before          int    // N before the first heartbeat
		beforeSource    string // and its source
		after           int    // N once two nodes have beaten
		afterSource     string
	}{
		{"default", 0, 0, DefaultFallbackNodesInitial, "default", 2, "registry"},
		{"initial", 0, 12, 12, "initial", 2, "registry"},
		{"pinned", 3, 12, 3, "flag", 3, "flag"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := "fn-" + tt.name
			nodes := redisbackend.NewNodes(redisbackend.NodesOptions{Client: srv.Client(), ID: "a", Prefix: prefix, Timeout: time.Second})
			other := redisbackend.NewNodes(redisbackend.NodesOptions{Client: srv.Client(), ID: "b", Prefix: prefix, Timeout: time.Second})
			fn := fallbackNodes{pinned: tt.pinned, initial: tt.initial, registry: nodes}
			reg := prometheus.NewPedanticRegistry()
			fn.register(reg)
			check := func(when string, want int, source string) {
				t.Helper()
				if n, s := fn.count(); n != want || s != source {
					t.Errorf("%s: N = %d from %s, want %d from %s", when, n, s, want, source)
				}
				if got := gaugeValue(t, reg, "ratelimit_live_nodes", ""); got != float64(want) {
					t.Errorf("%s: ratelimit_live_nodes %v, want %d", when, got, want)
				}
				for _, src := range []string{"flag", "registry", "initial", "default"} {
					want := 0.0
					if src == source {
						want = float64(tt.before)
						if when != "before" {
							want = float64(tt.after)
						}
					}
					if got := gaugeValue(t, reg, "ratelimit_fallback_nodes", src); got != want {
						t.Errorf("%s: ratelimit_fallback_nodes{source=%q} %v, want %v", when, src, got, want)
					}
				}
			}
			check("before", tt.before, tt.beforeSource)
			if err := other.Beat(ctx); err != nil {
				t.Fatal(err)
			}
			if err := nodes.Beat(ctx); err != nil {
				t.Fatal(err)
			}
			check("after", tt.after, tt.afterSource)
			srv.Kill() // the registry's count is kept while Redis is down
			defer srv.Restart()
			if err := nodes.Beat(ctx); err == nil {
				t.Fatal("heartbeat on a killed Redis succeeded")
			}
			check("with Redis down", tt.after, tt.afterSource)
		})
	}
}

// gaugeValue returns the value of gauge name (with that source label,
// when not empty) in reg.
func gaugeValue(t *testing.T, reg *prometheus.Registry, name, source string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			match := source == ""
			for _, l := range m.GetLabel() {
				match = match || (l.GetName() == "source" && l.GetValue() == source)
			}
			if match {
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no %s{source=%q}", name, source)
	return 0
}

func TestTrustCA(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.pem")
	if err := os.WriteFile(bad, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	plain, _ := redisbackend.ParseURL("redis://127.0.0.1:6379/0", time.Second)
	if err := TrustCA(plain, bad); err == nil || !strings.Contains(err.Error(), "TLS URL") {
		t.Errorf("TrustCA on redis://: %v, want an error asking for a TLS URL", err)
	}
	tlsOpts, _ := redisbackend.ParseURL("rediss://127.0.0.1:6379/0", time.Second)
	if err := TrustCA(tlsOpts, bad); err == nil || !strings.Contains(err.Error(), "no PEM") {
		t.Errorf("TrustCA with a bad bundle: %v", err)
	}
}

// TestServeRedisClientCert runs a node against a real redis-server that
// requires client certificates (tls-auth-clients yes): with RedisTLSCert
// and RedisTLSKey the node decides in Redis (the request's bucket is
// there); without a certificate Redis refuses a client.
func TestServeRedisClientCert(t *testing.T) {
	p := pkitest.New(t)
	srv := redistest.Start(t, redistest.WithTLS(p, true))
	redisURL := "rediss://" + srv.Addr() + "/0"

	opts, err := redisbackend.ParseURL(redisURL, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := TrustCA(opts, p.CA); err != nil {
		t.Fatal(err)
	}
	noCert := goredis.NewUniversalClient(opts)
	defer noCert.Close()
	if err := noCert.Ping(context.Background()).Err(); err == nil {
		t.Fatal("Redis with tls-auth-clients yes answered a client without a certificate")
	}

	o := testOptions()
	o.Redis, o.RedisCA, o.RedisTimeout = redisURL, p.CA, time.Second
	o.RedisTLSCert, o.RedisTLSKey = p.ClientCert, p.ClientKey
	rls := start(t, o)
	// The example rules limit user_id globally: the decision leaves its
	// bucket in Redis before the answer, unless the node is in fallback.
	if _, err := rls.Client().ShouldRateLimit(context.Background(), edgeRequest("user_id", "tls-client")); err != nil {
		t.Fatal(err)
	}
	opts.TLSConfig.Certificates = []tls.Certificate{p.Client}
	withCert := goredis.NewUniversalClient(opts)
	defer withCert.Close()
	keys, err := withCert.Keys(context.Background(), "*").Result()
	if err != nil || len(keys) == 0 {
		t.Errorf("keys in Redis after a decision: %q, %v; want the bucket\nlog:\n%s", keys, err, rls.Log.String())
	}
	if strings.Contains(rls.Log.String(), "fallback") {
		t.Errorf("the node went to fallback:\n%s", rls.Log.String())
	}
	rls.StopCleanly()
}

// TestServeWithRedisStopsCleanly runs a node on a real Redis, makes one
// call through the global layer and stops it: Run returns nil, and
// TestMain's goleak finds nothing of the Redis client, the node registry,
// the fallback probe or the memory backends still running.
func TestServeWithRedisStopsCleanly(t *testing.T) {
	srv := redistest.Start(t)
	o := testOptions()
	o.Redis, o.RedisTimeout = "redis://"+srv.Addr()+"/0", time.Second
	s := start(t, o)
	// The example rules limit remote_address 50.0.0.5 globally to 0.
	resp, err := s.Client().ShouldRateLimit(context.Background(), edgeRequest("remote_address", "50.0.0.5"))
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || s.Serving()["backend"] != "redis" {
		t.Errorf("answer %v, log:\n%s\nwant OVER_LIMIT from the Redis backend", resp.GetOverallCode(), s.Log.String())
	}
	s.StopCleanly()
	if !strings.Contains(s.Log.String(), `"msg":"stopped"`) {
		t.Errorf("no stopped line:\n%s", s.Log.String())
	}
}

// TestHeartbeatFailuresCounted: a heartbeat that fails (Redis gone) counts
// in ratelimit_heartbeat_failures_total, so that an operator sees why the
// node count stands still; it logs only at debug.
func TestHeartbeatFailuresCounted(t *testing.T) {
	srv := redistest.Start(t)
	o := testOptions()
	o.Redis, o.RedisTimeout = "redis://"+srv.Addr()+"/0", time.Second
	s := start(t, o)
	s.Addrs()
	if _, metrics := httpGet(t, s.HTTP()+"/metrics"); !strings.Contains(metrics, "ratelimit_heartbeat_failures_total 0\n") {
		t.Fatalf("/metrics before Redis stops:\n%s", grepLines(metrics, "ratelimit_heartbeat"))
	}
	srv.Kill()
	for deadline := time.Now().Add(30 * time.Second); ; {
		_, metrics := httpGet(t, s.HTTP()+"/metrics")
		if strings.Contains(metrics, "ratelimit_heartbeat_failures_total ") && !strings.Contains(metrics, "ratelimit_heartbeat_failures_total 0\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no failed heartbeat counted 30 s after Redis was killed:\n%s", grepLines(metrics, "ratelimit_heartbeat"))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
