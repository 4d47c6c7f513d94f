package node

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	redisbackend "github.com/sluice-rls/sluice/backend/redis"
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
