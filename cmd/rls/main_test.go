package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/internal/logtest"
	"github.com/sluice-rls/sluice/internal/redistest"
)

// TestMain fails the package when goroutines outlive its tests: serve's
// tests run the whole server in-process and stop it by cancelling its
// context, which must leave nothing running.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func noEnv(string) string { return "" }

func TestServeJSONLogsAndStopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr logtest.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--log-format", "json"}, &stderr, &stderr, noEnv)
	}()
	deadline := time.Now().Add(10 * time.Second)
	var start map[string]any
	for start == nil {
		if time.Now().After(deadline) {
			t.Fatalf("no start line:\n%s", stderr.String())
		}
		for _, line := range strings.Split(stderr.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "serving" {
				start = m
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, k := range []string{"grpc_addr", "http_addr", "admin_addr", "backend", "rules", "rule_count"} {
		if _, ok := start[k]; !ok {
			t.Errorf("start line lacks %s: %v", k, start)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve returned %v after cancel, want nil", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop after cancel")
	}
}

func TestRunErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no command", nil, "usage"},
		{"unknown command", []string{"fly"}, "unknown command"},
		{"bad flag", []string{"serve", "--no-such-flag"}, "no-such-flag"},
		{"bad failure mode", []string{"serve", "--redis-failure", "maybe"}, `-redis-failure: unknown failure mode "maybe"`},
		{"validate without paths", []string{"validate"}, "usage: rls validate"},
		{"check without descriptors", []string{"check"}, "usage: rls check"},
		{"check bad descriptor", []string{"check", "novalue"}, "want KEY=VALUE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), tt.args, &out, &errOut, noEnv)
			if err == nil {
				t.Fatalf("run(%q) succeeded", tt.args)
			}
			if got := errOut.String() + err.Error(); !strings.Contains(got, tt.want) {
				t.Errorf("run(%q): %v, stderr %q; want %q", tt.args, err, errOut.String(), tt.want)
			}
			if errors.Is(err, errUsage) && exitCode(err) != 2 {
				t.Errorf("usage error exits %d, want 2", exitCode(err))
			}
		})
	}
}

func TestTrustCA(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.pem")
	if err := os.WriteFile(bad, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	plain, _ := redisbackend.ParseURL("redis://127.0.0.1:6379/0", time.Second)
	if err := trustCA(plain, bad); err == nil || !strings.Contains(err.Error(), "TLS URL") {
		t.Errorf("trustCA on redis://: %v, want an error asking for a TLS URL", err)
	}
	tlsOpts, _ := redisbackend.ParseURL("rediss://127.0.0.1:6379/0", time.Second)
	if err := trustCA(tlsOpts, bad); err == nil || !strings.Contains(err.Error(), "no PEM") {
		t.Errorf("trustCA with a bad bundle: %v", err)
	}
}

// TestServeWithRedisStopsCleanly runs serve on a real Redis, makes one
// call through the global layer and stops it: serve returns nil, and
// TestMain's goleak finds nothing of the Redis client, the node registry,
// the fallback probe or the memory backends still running.
func TestServeWithRedisStopsCleanly(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr logtest.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", "",
			"--log-format", "json", "--redis", "redis://" + srv.Addr() + "/0", "--redis-timeout", "1s"}, &stderr, &stderr, noEnv)
	}()
	conn, err := grpc.NewClient(grpcAddr(t, &stderr), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The example rules limit remote_address 50.0.0.5 globally to 0.
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{{
		Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "50.0.0.5"}},
	}}}
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || !strings.Contains(stderr.String(), `"backend":"redis"`) {
		t.Errorf("answer %v, log:\n%s\nwant OVER_LIMIT from the Redis backend", resp.GetOverallCode(), stderr.String())
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve returned %v after cancel, want nil", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop after cancel")
	}
	if !strings.Contains(stderr.String(), `"msg":"stopped"`) {
		t.Errorf("no stopped line:\n%s", stderr.String())
	}
}
