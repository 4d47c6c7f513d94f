package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-rls/sluice/internal/pkitest"
	"github.com/sluice-rls/sluice/service"
)

const usageTestRules = `domain: edge
descriptors:
  - key: user_id
    rate_limit:
      name: per_user
      unit: minute
      requests_per_unit: 60
      burst: 10
      local: {unit: hour, requests_per_unit: 5}
`

// TestUsageCommand runs `rls serve` with mTLS, spends tokens over gRPC,
// then reads them with `rls usage` over the admin address (HTTPS, client
// certificate), and the refused values with `rls usage --top`.
func TestUsageCommand(t *testing.T) {
	p := pkitest.New(t)
	rules := writeRuleFile(t, t.TempDir(), "rules.yaml", usageTestRules)
	line := serveInProcess(t, noEnv, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
		"--log-format", "json", "--config", rules, "--top-refused", "8",
		"--tls-cert", p.ServerCert, "--tls-key", p.ServerKey, "--tls-client-ca", p.CA, "--admin-tls-client-ca", p.CA).Serving()
	admin, grpcAddr := line["admin_addr"].(string), line["grpc_addr"].(string)

	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: p.Roots, Certificates: []tls.Certificate{p.Client}, ServerName: pkitest.ServerName,
	})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	req := edgeRequest("user_id", "alice")
	refused := 0
	for range 7 { // 5 allowed by the local 5/hour, 2 refused
		resp, err := client.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			refused++
		}
	}
	if refused != 2 {
		t.Fatalf("%d of 7 refused, want 2", refused)
	}

	mtls := []string{"--addr", admin, "--tls-ca", p.CA, "--tls-cert", p.ClientCert, "--tls-key", p.ClientKey}
	code, out, errOut := runRLS(t, nil, append(append([]string{"usage"}, mtls...), "--domain", "edge", "user_id=alice", "user_id=bob,x=y")...)
	if code != 0 {
		t.Fatalf("rls usage: exit %d, stderr %s", code, errOut)
	}
	wantLines := []string{
		"domain edge",
		"  user_id=alice: rule edge.user_id (per_user)",
		"    local: limit 5/hour, burst 5, remaining 0 (100% in use), full in 1h0m0s [memory (this node)]",
		// 60/minute, burst 10: 5 taken (refused requests take nothing), 5 s to refill.
		"    global: limit 60/minute, burst 10, remaining 5 (50% in use), full in 5s [memory (this node)]",
		"  user_id=bob,x=y: no rule",
	}
	if got := strings.Split(strings.TrimSpace(out), "\n"); strings.Join(got, "\n") != strings.Join(wantLines, "\n") {
		// full-in times move with the real clock: compare all but them.
		if len(got) != len(wantLines) || !strings.HasPrefix(got[2], "    local: limit 5/hour, burst 5, remaining 0 (100% in use), full in 59m") ||
			!strings.HasPrefix(got[3], "    global: limit 60/minute, burst 10, remaining 5 (50% in use), full in 4.") ||
			got[0] != wantLines[0] || got[1] != wantLines[1] || got[4] != wantLines[4] {
			t.Fatalf("rls usage printed:\n%s\nwant:\n%s", out, strings.Join(wantLines, "\n"))
		}
	}

	code, out, errOut = runRLS(t, nil, append(append([]string{"usage"}, mtls...), "--json", "--domain", "edge", "user_id=alice")...)
	var u service.Usage
	if code != 0 || json.Unmarshal([]byte(out), &u) != nil || len(u.Descriptors) != 1 || len(u.Descriptors[0].Layers) != 2 {
		t.Fatalf("rls usage --json: exit %d, %s %s", code, out, errOut)
	}

	code, out, errOut = runRLS(t, nil, append(append([]string{"usage"}, mtls...), "--top", "--domain", "edge")...)
	want := "refused most over the last 5 minutes (8 counters per rule and minute)\n" +
		"  edge edge.user_id: 2 refused, counts at most 0 too high\n" +
		"    2  user_id=alice\n"
	if code != 0 || out != want {
		t.Fatalf("rls usage --top: exit %d, stdout:\n%s\nwant:\n%s\nstderr %s", code, out, want, errOut)
	}

	for _, tc := range []struct {
		name string
		args []string
		says string
	}{
		{"unknown domain", append(withArgs(mtls), "--domain", "nope", "user_id=a"), `404 Not Found: domain "nope": no rules for this domain`},
		{"no client certificate", []string{"--addr", admin, "--tls-ca", p.CA, "--domain", "edge", "user_id=a"}, "GET https://"},
		{"plaintext to TLS", []string{"--addr", admin, "--domain", "edge", "user_id=a"}, "400 Bad Request"},
		{"bad descriptor", append(withArgs(mtls), "--domain", "edge", "user_id"), "want KEY=VALUE"},
		{"no domain", append(withArgs(mtls), "user_id=a"), "--domain is required"},
		{"no descriptor", append(withArgs(mtls), "--domain", "edge"), "usage: rls usage"},
		{"top with descriptors", append(withArgs(mtls), "--top", "user_id=a"), "--top takes no descriptors"},
		{"top minutes", append(withArgs(mtls), "--top", "--minutes", "9"), "--minutes must be from 1 to 5"},
		{"cert without key", []string{"--addr", admin, "--tls-cert", p.ClientCert, "--domain", "edge", "user_id=a"}, "go together"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runRLS(t, nil, append([]string{"usage", "--timeout", "10s"}, tc.args...)...)
			if code != 2 || !strings.Contains(errOut, tc.says) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want 2 saying %q", code, out, errOut, tc.says)
			}
		})
	}
}

// TestUsageOffWhenTopRefusedZero: `rls serve --top-refused 0` keeps no
// values, and `rls usage --top` says so (exit 2). Plaintext admin address
// on a unix socket.
func TestUsageOffWhenTopRefusedZero(t *testing.T) {
	dir, err := os.MkdirTemp("", "rls") // short: socket paths are bounded
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	admin := "unix:" + filepath.Join(dir, "admin.sock")
	serveInProcess(t, noEnv, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", admin,
		"--log-format", "json", "--top-refused", "0").Serving()
	code, out, errOut := runRLS(t, nil, "usage", "--addr", admin, "--top")
	if code != 2 || !strings.Contains(errOut, "--top-refused 0") {
		t.Fatalf("rls usage --top: exit %d, stdout %q, stderr %q; want 2 naming --top-refused 0", code, out, errOut)
	}
	// The embedded rules, plaintext: a full bucket.
	code, out, errOut = runRLS(t, nil, "usage", "--addr", admin, "--domain", "edge", "user_id=zed")
	if code != 0 || !strings.Contains(out, "global: limit 10/second, burst 20, remaining 20 (0% in use), full in 0s") {
		t.Fatalf("rls usage: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestUsageTenantUtilisation: a real server with a rule that has
// utilisation; three hits of tenant acme show in `rls usage` (30% of the
// burst in use) and in /metrics (3 tokens against a quota of 10/hour); the
// rule without utilisation has no tenant series.
func TestUsageTenantUtilisation(t *testing.T) {
	rules := writeRuleFile(t, t.TempDir(), "rules.yaml", `domain: edge
descriptors:
  - key: tenant_id
    utilisation: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: user_id
    rate_limit: {unit: hour, requests_per_unit: 10}
`)
	line := serveInProcess(t, noEnv, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
		"--log-format", "json", "--config", rules).Serving()
	conn, err := grpc.NewClient(line["grpc_addr"].(string), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	for _, req := range []*rlsv3.RateLimitRequest{edgeRequest("tenant_id", "acme"), edgeRequest("tenant_id", "acme"), edgeRequest("tenant_id", "acme"), edgeRequest("user_id", "bob")} {
		if resp, err := client.ShouldRateLimit(context.Background(), req); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("ShouldRateLimit: %v, %v", resp.GetOverallCode(), err)
		}
	}
	// 10/hour refills a token every 6 minutes: the reading holds for the test.
	code, out, errOut := runRLS(t, nil, "usage", "--addr", line["admin_addr"].(string), "--domain", "edge", "tenant_id=acme")
	if code != 0 || !strings.Contains(out, "global: limit 10/hour, burst 10, remaining 7 (30% in use), full in ") {
		t.Fatalf("rls usage: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	status, body := httpGet(t, "http://"+line["http_addr"].(string)+"/metrics")
	for _, want := range []string{
		"\nratelimit_tenant_consumed_tokens_total{domain=\"edge\",rule=\"edge.tenant_id\",tenant=\"acme\"} 3\n",
		"\nratelimit_tenant_quota_tokens_per_second{domain=\"edge\",layer=\"global\",rule=\"edge.tenant_id\"} 0.002777777777777778\n",
	} {
		if status != 200 || !strings.Contains(body, want) {
			t.Errorf("/metrics (status %d) lacks %q", status, want)
		}
	}
	if strings.Contains(body, `rule="edge.user_id",tenant=`) {
		t.Error("/metrics has tenant series for the rule without utilisation")
	}
}
