//go:build integration

package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/internal/redistest"
)

// TestPeerEnvDeployment runs the built rls with nothing but a Deployment's
// envoyproxy/ratelimit variables: rules from RUNTIME_ROOT/
// RUNTIME_SUBDIRECTORY/config, a password-protected Redis from REDIS_*.
// It limits through that Redis, and never logs the password.
func TestPeerEnvDeployment(t *testing.T) {
	t.Parallel()
	const password = "s3cret-pw"
	redis := redistest.Start(t, redistest.WithArgs("--requirepass", password))
	root := t.TempDir()
	rules := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(rules, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, rules, "peer.yaml", "domain: peer\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2}\n")
	p := startRLSEnv(t, []string{
		"RLS_PEER_ENV=map",
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redis.Addr(), "REDIS_AUTH=" + password,
		"USE_STATSD=false", "LOG_LEVEL=info",
		// Not a peer setting: a busy machine must not send the node to its
		// fallback (10ms by default), whose share refuses the second request.
		"RLS_REDIS_TIMEOUT=2s",
	})
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := p.Client.ShouldRateLimit(context.Background(), request("peer", "user=alice"))
		if err != nil || resp.GetOverallCode() != want {
			t.Fatalf("request %d: %v, %v; want %v", i+1, resp.GetOverallCode(), err, want)
		}
	}
	// The buckets are in Redis, written with REDIS_AUTH's password.
	c := goredis.NewClient(&goredis.Options{Addr: redis.Addr(), Password: password})
	defer c.Close()
	if keys, err := c.Keys(context.Background(), "sluice:*").Result(); err != nil || len(keys) == 0 {
		t.Errorf("sluice keys in Redis: %v, %v; want some", keys, err)
	}
	if _, metrics := p.HTTPGet(t, "/metrics"); !strings.Contains(metrics, "ratelimit_fallback_active 0") {
		t.Errorf("the node is in fallback: REDIS_AUTH not applied?")
	}
	log := p.Log()
	for _, want := range []string{"backend=redis", "rule_count=1", `flag=--redis value="(not shown)"`, "flag=--config", "var=USE_STATSD"} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	if strings.Contains(log, password) {
		t.Errorf("the log shows the Redis password:\n%s", log)
	}
}

// TestPeerEnvRefused: a variable rls serve cannot honour stops it before
// it listens, with exit code 2 and the reason.
func TestPeerEnvRefused(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(rlsBinary, "serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", "")
	cmd.Env = rlsEnv("RLS_PEER_ENV=map", "REDIS_PERSECOND=true", "BACKEND_TYPE=memcache")
	out, err := cmd.CombinedOutput()
	ee, ok := err.(*exec.ExitError)
	if !ok || ee.ExitCode() != 2 {
		t.Fatalf("rls serve: %v, want exit code 2\n%s", err, out)
	}
	for _, want := range []string{`REDIS_PERSECOND="true": not supported`, `BACKEND_TYPE="memcache": not supported`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
