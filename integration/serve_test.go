//go:build integration

package integration

import (
	"context"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

func TestServeEmbeddedDefault(t *testing.T) {
	t.Parallel()
	p := startRLS(t)

	if got := p.Check(t, "edge", "remote_address=50.0.0.5").GetOverallCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("blocked address: %v, want OVER_LIMIT", got)
	}
	// Per-node burst of 20 for one address, then refusals from the local
	// layer. Requests go until the first refusal: a fixed 30 took more than
	// the 200ms in which the bucket refills 10 tokens on a busy machine, and
	// then none was refused.
	ok := 0
	start := time.Now()
	var refusal *rlsv3.RateLimitResponse
	for i := 0; refusal == nil && i < 1000; i++ {
		resp := p.Check(t, "edge", "remote_address=10.0.0.1")
		if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
			ok++
		} else {
			refusal = resp
		}
	}
	// The local bucket: burst 20, refilling 50/s during the loop.
	if most := 20 + int(50*time.Since(start).Seconds()) + 1; ok < 20 || ok > most {
		t.Errorf("remote_address admitted %d before the first refusal, want between the local burst of 20 and %d", ok, most)
	}
	if refusal == nil || !hasHeader(refusal, "x-ratelimit-layer", "local") {
		t.Errorf("refusal %v, want one with x-ratelimit-layer: local", refusal.GetResponseHeadersToAdd())
	}
	// The orders rule replaces the per-user one.
	resp := p.Check(t, "edge", "route=/api/orders/1,user_id=u1", "user_id=u1")
	if n := resp.GetStatuses()[0].GetCurrentLimit().GetName(); n != "orders_per_user" {
		t.Errorf("orders status limit name %q, want orders_per_user", n)
	}
	if l := resp.GetStatuses()[1].GetCurrentLimit(); l != nil {
		t.Errorf("replaced per_user rule still applied: %v", l)
	}

	health := healthpb.NewHealthClient(p.Conn)
	// The overall status, and envoyproxy/ratelimit's service name.
	for _, svc := range []string{"", "ratelimit"} {
		hr, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("gRPC health of %q = %v, %v; want SERVING", svc, hr, err)
		}
	}
	if code, body := p.HTTPGet(t, "/healthcheck"); code != http.StatusOK || !strings.Contains(body, "OK") {
		t.Errorf("/healthcheck = %d %q", code, body)
	}
	if code, body := p.HTTPGet(t, "/rlconfig"); code != http.StatusOK || !strings.Contains(body, "edge.remote_address_50.0.0.5") {
		t.Errorf("/rlconfig = %d %q", code, body)
	}
	if code, body := p.HTTPGet(t, "/metrics"); code != http.StatusOK || !strings.Contains(body, `ratelimit_requests_total{code="over_limit",domain="edge"}`) {
		t.Errorf("/metrics = %d, lacks ratelimit_requests_total:\n%.2000s", code, body)
	}
}

func TestJSONEndpoint(t *testing.T) {
	t.Parallel()
	p := startRLS(t)
	post := func(body string) (int, string) { return p.PostJSON(t, body) }
	code, body := post(`{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"50.0.0.5"}]}]}`)
	if code != http.StatusTooManyRequests || !strings.Contains(body, `"overallCode":"OVER_LIMIT"`) {
		t.Errorf("blocked: %d %s", code, body)
	}
	code, body = post(`{"domain":"edge","descriptors":[{"entries":[{"key":"user_id","value":"json-user"}]}]}`)
	if code != http.StatusOK || !strings.Contains(body, `"overallCode":"OK"`) {
		t.Errorf("allowed: %d %s", code, body)
	}
	if code, _ = post(`{"domain":`); code != http.StatusBadRequest {
		t.Errorf("malformed JSON: %d, want 400", code)
	}
	if code, _ = post(`{"domain":""}`); code != http.StatusBadRequest {
		t.Errorf("empty domain: %d, want 400", code)
	}
}

func TestMalformedRequestsKeepServing(t *testing.T) {
	t.Parallel()
	// (A long value is no malformed request: TestMalformedValuesAreLimited.)
	p := startRLS(t)
	bad := []*rlsv3.RateLimitRequest{
		request(""),
		request("edge", "=v"),
		request("edge", strings.Repeat("k=v,", 40)+"k=v"),
	}
	for i, req := range bad {
		_, err := p.Client.ShouldRateLimit(context.Background(), req)
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("bad request %d: %v, want InvalidArgument", i, err)
		}
	}
	if got := p.Check(t, "edge", "user_id=fine").GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("after bad requests: %v", got)
	}
}

func TestSIGTERMDrainsAndExitsZero(t *testing.T) {
	t.Parallel()
	p := startRLS(t)
	p.Check(t, "edge", "user_id=x")
	p.Signal(t, syscall.SIGTERM)
	if err := p.Wait(t, 15*time.Second); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	if log := p.Log(); !strings.Contains(log, "NOT_SERVING") || !strings.Contains(log, "msg=stopped") {
		t.Errorf("log lacks the drain lines:\n%s", log)
	}
}

func TestValidateCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := writeFile(t, dir, "good.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	bad := writeFile(t, dir, "bad.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	out, _, code := runRLS(t, "validate", good)
	if code != 0 || !strings.Contains(out, "ok, 1 rules") {
		t.Errorf("validate good: code %d out %q", code, out)
	}
	_, errOut, code := runRLS(t, "validate", bad)
	if code == 0 || !strings.Contains(errOut, "bad.yaml:4:") || !strings.Contains(errOut, "fortnight") {
		t.Errorf("validate bad: code %d stderr %q", code, errOut)
	}
	out, errOut, code = runRLS(t, "validate", "-h")
	if code != 0 || !strings.Contains(errOut, "usage: rls validate") || !strings.Contains(errOut, "-merge-domains") {
		t.Errorf("validate -h: code %d stdout %q stderr %q, want 0 and the usage", code, out, errOut)
	}
}

// TestValidateAgreesWithServe: validate loads its arguments as the one
// rule set serve loads from a directory, with serve's loading flags. Two
// files of one domain fail both; with --merge-domains both accept them.
func TestValidateAgreesWithServe(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a := writeFile(t, dir, "a.yaml", minuteRules("d", "2"))
	b := writeFile(t, dir, "b.yaml", "domain: d\ndescriptors:\n  - key: other\n    rate_limit: {unit: minute, requests_per_unit: 3}\n")

	_, errOut, code := runRLS(t, "validate", a, b)
	if code != 1 || !strings.Contains(errOut, b) || !strings.Contains(errOut, "duplicate domain") {
		t.Errorf("validate a.yaml b.yaml: code %d stderr %q; want 1, blaming b.yaml for the duplicate domain", code, errOut)
	}
	_, errOut, code = runRLS(t, "serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", "", "--config", dir)
	if code == 0 || !strings.Contains(errOut, b) || !strings.Contains(errOut, "duplicate domain") {
		t.Errorf("serve --config dir: code %d stderr %q; want it to refuse b.yaml as validate does", code, errOut)
	}

	out, errOut, code := runRLS(t, "validate", "--merge-domains", dir)
	if code != 0 || !strings.Contains(out, "ok, 2 rules") {
		t.Errorf("validate --merge-domains dir: code %d stdout %q stderr %q", code, out, errOut)
	}
	p := startRLS(t, "--config", dir, "--merge-domains")
	if _, body := p.HTTPGet(t, "/rlconfig"); !strings.Contains(body, "d.k") || !strings.Contains(body, "d.other") {
		t.Errorf("serve --merge-domains: /rlconfig %q, want both files' rules", body)
	}
}

func TestCheckCommand(t *testing.T) {
	t.Parallel()
	p := startRLS(t)
	out, errOut, code := runRLS(t, "check", "--addr", p.GRPCAddr, "--domain", "edge", "remote_address=50.0.0.5")
	// 1: OVER_LIMIT; a limit of 0 tells no time to retry.
	if code != 1 || !strings.HasPrefix(out, "OVER_LIMIT") || !strings.Contains(out, "header x-ratelimit-layer: global") || strings.Contains(out, "retry-after") {
		t.Errorf("check: code %d out %q err %q", code, out, errOut)
	}
	out, _, _ = runRLS(t, "version")
	if !strings.HasPrefix(out, "rls ") {
		t.Errorf("version: %q", out)
	}
}

func hasHeader(resp *rlsv3.RateLimitResponse, key, value string) bool {
	for _, h := range resp.GetResponseHeadersToAdd() {
		if strings.EqualFold(h.GetKey(), key) && h.GetValue() == value {
			return true
		}
	}
	return false
}
