//go:build integration

package integration

import (
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestPprofCmdlineHidesSecrets starts with a Redis password on the command
// line and --pprof: no pprof page may show it.
func TestPprofCmdlineHidesSecrets(t *testing.T) {
	t.Parallel()
	const secret = "s3cret-in-argv"
	p := startRLS(t, "--pprof", "--redis", "redis://:"+secret+"@127.0.0.1:1/0", "--fallback-nodes", "1")
	for _, path := range []string{"/debug/pprof/cmdline", "/debug/pprof/", "/debug/pprof/cmdline?debug=1"} {
		_, body := p.AdminGet(t, path)
		if strings.Contains(body, secret) {
			t.Errorf("GET %s shows the password from the command line:\n%.500s", path, body)
		}
	}
	if code, _ := p.AdminGet(t, "/debug/pprof/cmdline"); code != 404 {
		t.Errorf("/debug/pprof/cmdline: %d, want 404", code)
	}
	// pprof itself is still served.
	if code, body := p.AdminGet(t, "/debug/pprof/"); code != 200 || !strings.Contains(body, "goroutine") {
		t.Errorf("/debug/pprof/: %d", code)
	}
}

// drainRules is one rule of 2 requests per minute: a drained bucket stays
// drained for the whole test unless tokens are given back.
const drainRules = "domain: m\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"

// drain spends the bucket k=v of drainRules through gRPC and checks it is
// empty.
func drain(t *testing.T, p *rlsProcess, v string) {
	t.Helper()
	for range 2 {
		p.Check(t, "m", "k="+v)
	}
	if got := p.Check(t, "m", "k="+v).GetOverallCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("bucket k=%s after 3 requests: %v, want OVER_LIMIT", v, got)
	}
}

func TestJSONOnlyOnAdminAddress(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, dir, "m.yaml", drainRules)
	p := startRLS(t, "--config", dir)
	req := `{"domain":"m","descriptors":[{"entries":[{"key":"k","value":"http"}]}]}`
	for range 3 {
		resp, err := http.Post("http://"+p.HTTPAddr+"/json", "application/json", strings.NewReader(req))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), "--admin-addr") {
			t.Errorf("POST /json on --http-addr: %d %q, want 404 naming --admin-addr", resp.StatusCode, body)
		}
	}
	// Nothing was spent through the HTTP address.
	if got := p.Check(t, "m", "k=http").GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("after 3 posts on --http-addr the bucket is %v, want OK (untouched)", got)
	}
	if code, body := p.PostJSON(t, req); code != http.StatusOK {
		t.Errorf("POST /json on --admin-addr: %d %s", code, body)
	}

	const warning = "the admin address is reachable from the network without client certificates"
	if strings.Contains(p.Log(), warning) {
		t.Errorf("warning logged for a loopback admin address:\n%s", p.Log())
	}
	// Every interface (a random port, for the test's lifetime only): warned.
	wide := startRLS(t, "--admin-addr", ":0")
	if !strings.Contains(wide.Log(), warning) {
		t.Errorf("no warning for --admin-addr :0:\n%s", wide.Log())
	}

	off := startRLS(t, "--admin-addr", "")
	if off.AdminAddr != "off" {
		t.Errorf("with --admin-addr \"\" the serving line says admin_addr=%s, want off", off.AdminAddr)
	}
	if code, body := off.HTTPGet(t, "/json"); code != http.StatusNotFound || !strings.Contains(body, "off") {
		t.Errorf("/json with the admin address off: %d %q", code, body)
	}
}

func TestJSONRefusesNegativeHits(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, dir, "m.yaml", drainRules)
	give := `{"domain":"m","hitsAddend":1000,"descriptors":[{"entries":[{"key":"k","value":"VALUE"}],"isNegativeHits":true}]}`

	p := startRLS(t, "--config", dir)
	drain(t, p, "victim")
	code, body := p.PostJSON(t, strings.ReplaceAll(give, "VALUE", "victim"))
	if code != http.StatusForbidden || !strings.Contains(body, "--json-negative-hits") {
		t.Errorf("is_negative_hits on /json: %d %q, want 403 naming --json-negative-hits", code, body)
	}
	if got := p.Check(t, "m", "k=victim").GetOverallCode(); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("after a refused give the bucket answers %v, want OVER_LIMIT (not refilled)", got)
	}

	allowed := startRLS(t, "--config", dir, "--json-negative-hits")
	drain(t, allowed, "victim")
	if code, body := allowed.PostJSON(t, strings.ReplaceAll(give, "VALUE", "victim")); code != http.StatusOK {
		t.Errorf("is_negative_hits with --json-negative-hits: %d %s, want 200", code, body)
	}
	if got := allowed.Check(t, "m", "k=victim").GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("after an allowed give the bucket answers %v, want OK", got)
	}
}

// TestAdminMutualTLS: with --admin-tls-client-ca, /json asks for client
// certificates of that CA (here the same as gRPC's); /healthcheck stays
// plaintext for the kubelet.
func TestAdminMutualTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	writeFile(t, dir, "m.yaml", drainRules)
	m := newMTLS(t)
	p := startRLS(t, append([]string{"--config", dir, "--admin-tls-client-ca", m.CA}, m.flags...)...)
	roots := m.Roots
	post := func(scheme string, certs []tls.Certificate) (int, error) {
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: certs, ServerName: "sluice"},
		}}
		resp, err := c.Post(scheme+"://"+p.AdminAddr+"/json", "application/json",
			strings.NewReader(`{"domain":"m","descriptors":[{"entries":[{"key":"k","value":"tls"}]}]}`))
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	if code, err := post("http", nil); err == nil && code == http.StatusOK {
		t.Errorf("plaintext POST /json was served")
	}
	if _, err := post("https", nil); err == nil {
		t.Errorf("POST /json without a client certificate was served")
	}
	if code, err := post("https", []tls.Certificate{m.Client}); err != nil || code != http.StatusOK {
		t.Errorf("POST /json with a client certificate: %d, %v; want 200", code, err)
	}
	if code, body := p.HTTPGet(t, "/healthcheck"); code != http.StatusOK {
		t.Errorf("/healthcheck (plaintext) with TLS on gRPC: %d %q", code, body)
	}
}
