package node

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-rls/sluice/ruleset"
)

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
		GRPCHandshakeTimeout: time.Second,
		HeaderLimit:          "RateLimit-Limit", HeaderRemaining: "RateLimit-Remaining", HeaderReset: "RateLimit-Reset",
		MaxDescriptors: 8, MaxEntries: 8, MaxValueBytes: 64, MaxBuckets: 1000, MaxMetricValues: 10,
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
	conn, err := grpc.NewClient(a.GRPC.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
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
