package node

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rls/sluice/internal/redistest"
	"github.com/sluice-rls/sluice/override"
)

// TestRLConfigShowsOverrideCounts: the public /rlconfig shows the
// overrides as counts by kind, never a blocked value, an author or a
// reason; the authenticated admin /overrides lists them in full (on main
// /rlconfig printed every override line).
func TestRLConfigShowsOverrideCounts(t *testing.T) {
	tokens := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, tokens, "alice:alice-token-0123456789\n")
	auth, err := newAdminAuth(tokens, false, discardLogger(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	admin, o := adminServer(t, auth, nil)
	ctx := context.Background()
	for _, ov := range []override.Override{
		{Domain: "edge", Value: "user_id=AKIA-LEAKED-SECRET", Kind: override.KindBlock, Reason: "leaked key of customer acme"},
		{Domain: "edge", Value: "user_id=other-secret", Kind: override.KindBlock, Reason: "second leak"},
		{Domain: "edge", Rule: "edge.user_id", Kind: override.KindScale, Factor: 0.5, Reason: "incident 42"},
	} {
		if _, err := o.mgr.Set(ctx, ov, "alice"); err != nil {
			t.Fatal(err)
		}
	}
	var draining atomic.Bool
	pub := httptest.NewServer(newHTTPMux(func() string { return "memory" }, o.rules, prometheus.NewRegistry(), &draining, "127.0.0.1:8082", nil, XDS{}, o))
	defer pub.Close()
	body := get(t, pub.URL+"/rlconfig", "")
	for _, secret := range []string{"AKIA-LEAKED-SECRET", "other-secret", "alice", "leaked key", "incident 42"} {
		if strings.Contains(body, secret) {
			t.Errorf("public /rlconfig shows %q:\n%s", secret, body)
		}
	}
	if !strings.Contains(body, "# overrides: 3 active (scale 1, block 2); the list: rls override list") {
		t.Errorf("public /rlconfig:\n%s\nwant the counts by kind", body)
	}
	full := get(t, admin.URL+"/overrides", "alice-token-0123456789")
	for _, want := range []string{"AKIA-LEAKED-SECRET", "leaked key of customer acme", `"author": "alice"`} {
		if !strings.Contains(full, want) {
			t.Errorf("admin /overrides lacks %q:\n%s", want, full)
		}
	}
}

func get(t *testing.T, url, token string) string {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b.String())
	}
	return b.String()
}

// TestAdminRefusesFarLoosening: POST /overrides refuses an allow expiring
// in ~2319 and a shadow without an expiry with 400 and a clear error.
func TestAdminRefusesFarLoosening(t *testing.T) {
	tokens := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, tokens, "alice:alice-token-0123456789\n")
	auth, err := newAdminAuth(tokens, false, discardLogger(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := adminServer(t, auth, nil)
	for _, tt := range []struct{ body, want string }{
		{`{"domain":"edge","rule":"edge.user_id","kind":"allow","reason":"r","expires_in":"2562047h"}`, "--override-max-expiry"},
		{`{"domain":"edge","kind":"shadow","reason":"r"}`, "shadow needs an expiry"},
		{`{"kind":"shadow","reason":"r","expires_in":"1h"}`, "shadow needs a domain"},
		{`{"domain":"edge","rule":"edge.login","kind":"shadow","reason":"r","expires_in":"1h"}`, "cannot be shadowed"},
	} {
		if code, body := postOverride(t, srv.URL, "alice-token-0123456789", tt.body); code < 400 || code >= 500 || !strings.Contains(body, tt.want) {
			t.Errorf("POST %s: %d %s, want refused with %q", tt.body, code, body, tt.want)
		}
	}
}

// TestOverrideSetOutlastsDecisionTimeout: an operator's override on a node
// on Redis is written while Redis stalls longer than the decisions'
// timeouts allow (--redis-timeout 10ms, so go-redis' socket timeouts of
// 100ms): the override store's calls get the Manager's one second (on
// main: 503, "i/o timeout", the socket timeout winning over the context's
// deadline).
func TestOverrideSetOutlastsDecisionTimeout(t *testing.T) {
	srv := redistest.Start(t)
	tokens := filepath.Join(t.TempDir(), "tokens")
	writeTokens(t, tokens, "alice:alice-token-0123456789\n")
	o := testOptions()
	o.AdminAddr = "127.0.0.1:0"
	o.Overrides.AdminTokenFile = tokens
	o.Redis, o.RedisTimeout = "redis://"+srv.Addr()+"/0", 10*time.Millisecond
	s := start(t, o)
	admin := "http://" + s.Addrs().Admin.String()
	// Every other client waits 400ms; this one's CLIENT PAUSE returns at once.
	if err := srv.Client().Do(t.Context(), "CLIENT", "PAUSE", "400", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	if code, body := postOverride(t, admin, "alice-token-0123456789", `{"domain":"edge","value":"user_id=worm","kind":"block","reason":"leaked key"}`); code != http.StatusOK {
		t.Errorf("block while Redis stalls 400ms: %d %s, want 200", code, body)
	}
}

// postOverride POSTs body to base's /overrides with token and returns the
// status and body.
func postOverride(t *testing.T, base, token, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", base+"/overrides", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}
