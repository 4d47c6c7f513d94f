package node

import (
	"crypto/tls"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/internal/logtest"
	"github.com/sluice-rls/sluice/override"
	"github.com/sluice-rls/sluice/ruleset"
)

// adminRules has a rule overrides may loosen and a protected one; the
// override CLI's tests in cmd/rls serve it too.
const adminRules = "testdata/admin-rules.yaml"

// adminServer serves /overrides of a memory-only Manager with auth on an
// httptest server (TLS requiring client certificates when tlsCfg is set).
func adminServer(t *testing.T, auth *adminAuth, tlsCfg *tls.Config) (*httptest.Server, *overrides) {
	t.Helper()
	cfg, err := ruleset.LoadPaths([]string{adminRules}, descriptors.Options{}, ruleset.DefaultMaxRuleBytes)
	if err != nil {
		t.Fatal(err)
	}
	rules := ruleset.NewStore(cfg)
	store, _ := override.OpenFile("")
	o := &overrides{mgr: override.NewManager(override.ManagerOptions{Store: store, Rules: rules.Rules}), rules: rules, auth: auth}
	mux := http.NewServeMux()
	o.mount(mux)
	srv := httptest.NewUnstartedServer(mux)
	if tlsCfg != nil {
		srv.TLS = tlsCfg
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return srv, o
}

func writeTokens(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestOverridesNeedAToken(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	writeTokens(t, tokens, "# operators\nalice:alice-token-0123456789\nbob:bob-token-0123456789\n")
	auth, err := newAdminAuth(tokens, false, discardLogger(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	srv, o := adminServer(t, auth, nil)
	body := `{"domain":"edge","rule":"edge.user_id","kind":"scale","factor":2,"reason":"promo","expires_in":"1h"}`
	for _, tt := range []struct {
		name, method, path, auth, body string
		want                           int
	}{
		{"no token", "POST", "/overrides", "", body, http.StatusUnauthorized},
		{"wrong token", "POST", "/overrides", "Bearer nope-nope-nope-nope-nope", body, http.StatusUnauthorized},
		{"basic auth", "GET", "/overrides", "Basic YWxpY2U6eA==", "", http.StatusUnauthorized},
		{"list without token", "GET", "/overrides", "", "", http.StatusUnauthorized},
		{"rm without token", "DELETE", "/overrides/x", "", "", http.StatusUnauthorized},
		{"an author field is not the client's to give", "POST", "/overrides", "Bearer alice-token-0123456789",
			`{"domain":"edge","kind":"shadow","reason":"r","author":"mallory"}`, http.StatusBadRequest},
		{"protected rule", "POST", "/overrides", "Bearer alice-token-0123456789",
			`{"domain":"edge","rule":"edge.login","kind":"allow","reason":"r","expires_in":"1h"}`, http.StatusForbidden},
		{"allow without expiry", "POST", "/overrides", "Bearer alice-token-0123456789",
			`{"domain":"edge","rule":"edge.user_id","kind":"allow","reason":"r"}`, http.StatusBadRequest},
		{"set", "POST", "/overrides", "Bearer alice-token-0123456789", body, http.StatusOK},
		{"rm unknown", "DELETE", "/overrides/nope", "Bearer bob-token-0123456789", "", http.StatusNotFound},
	} {
		req, _ := http.NewRequest(tt.method, srv.URL+tt.path, strings.NewReader(tt.body))
		if tt.auth != "" {
			req.Header.Set("Authorization", tt.auth)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("%s: %s %s = %d %s, want %d", tt.name, tt.method, tt.path, resp.StatusCode, msg, tt.want)
		}
	}
	l := o.mgr.List()
	if len(l) != 1 || l[0].Author != "alice" {
		t.Fatalf("List() = %v, want one override by alice (the token's name)", l)
	}
	// A rewritten token file applies at the next call: alice's token is gone.
	writeTokens(t, tokens, "carol:carol-token-0123456789abc\n")
	req, _ := http.NewRequest("GET", srv.URL+"/overrides", nil)
	req.Header.Set("Authorization", "Bearer alice-token-0123456789")
	if resp, err := srv.Client().Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("alice after the rewrite: %v %v, want 401", resp.StatusCode, err)
	} else {
		resp.Body.Close()
	}
}

func TestTokenFileErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct{ content, want string }{
		{"alice:short\n", "shorter than 16 bytes"},
		{"just-a-token-without-a-name\n", "line 1: want name:token"},
		{"# nothing\n\n", "no tokens"},
	} {
		p := filepath.Join(dir, "t")
		writeTokens(t, p, tt.content)
		if _, err := newAdminAuth(p, false, discardLogger(), prometheus.NewRegistry()); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("token file %q: %v, want %q", tt.content, err, tt.want)
		}
	}
	if _, err := newAdminAuth(filepath.Join(dir, "missing"), false, discardLogger(), prometheus.NewRegistry()); err == nil {
		t.Error("missing token file: no error")
	}
}

func TestOverridesOffWithoutAuth(t *testing.T) {
	auth, _ := newAdminAuth("", false, discardLogger(), prometheus.NewRegistry())
	srv, _ := adminServer(t, auth, nil)
	resp, err := http.Get(srv.URL + "/overrides")
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(msg), "--admin-token-file") {
		t.Errorf("GET /overrides without auth configured: %d %s, want 404 saying how to turn it on", resp.StatusCode, msg)
	}
}

// TestTokenFileRevokes: every rewrite of the token file is the list of
// valid tokens from the next call on. A token taken out is refused; a file
// emptied, commented out, deleted, or with one line that does not parse
// refuses every token (fail closed), says so at error, and
// ratelimit_admin_token_file_valid is 0 until the file is fixed.
func TestTokenFileRevokes(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	const alice, bob = "alice-token-0123456789", "bob-token-0123456789"
	good := "alice:" + alice + "\nbob:" + bob + "\n"
	writeTokens(t, tokens, good)
	var logs logtest.Buffer
	reg := prometheus.NewRegistry()
	auth, err := newAdminAuth(tokens, false, slog.New(slog.NewTextHandler(&logs, nil)), reg)
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := adminServer(t, auth, nil)
	status := func(token string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+"/overrides", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	valid := func() float64 { return metricValue(t, reg, "ratelimit_admin_token_file_valid") }
	errorCount := func() float64 { return metricValue(t, reg, "ratelimit_admin_token_file_errors_total") }
	if got := status(alice); got != http.StatusOK || valid() != 1 {
		t.Fatalf("alice with a good file: %d, valid %v; want 200, 1", got, valid())
	}

	// A rewrite without bob revokes bob alone.
	writeTokens(t, tokens, "alice:"+alice+"\n")
	if a, b := status(alice), status(bob); a != http.StatusOK || b != http.StatusUnauthorized {
		t.Errorf("after bob was taken out: alice %d, bob %d; want 200, 401", a, b)
	}
	if !strings.Contains(logs.String(), "names=[bob]") {
		t.Errorf("no log line naming the revoked token:\n%s", logs.String())
	}

	for _, tt := range []struct {
		name  string
		write func()
	}{
		{"emptied", func() { writeTokens(t, tokens, "") }},
		{"commented out", func() { writeTokens(t, tokens, "# alice:"+alice+"\n# bob:"+bob+"\n") }},
		{"deleted", func() {
			if err := os.Remove(tokens); err != nil {
				t.Fatal(err)
			}
		}},
		{"one bad line", func() { writeTokens(t, tokens, good+"carol:short\n") }},
		{"a line without a name", func() { writeTokens(t, tokens, good+"just-a-token-without-a-name\n") }},
	} {
		writeTokens(t, tokens, good)
		if a, b := status(alice), status(bob); a != http.StatusOK || b != http.StatusOK {
			t.Fatalf("%s: with the good file again: alice %d, bob %d", tt.name, a, b)
		}
		before := errorCount()
		mark := len(logs.String())
		tt.write()
		if a, b := status(alice), status(bob); a != http.StatusUnauthorized || b != http.StatusUnauthorized {
			t.Errorf("%s: alice %d, bob %d; want 401, 401", tt.name, a, b)
		}
		if v := valid(); v != 0 {
			t.Errorf("%s: ratelimit_admin_token_file_valid = %v, want 0", tt.name, v)
		}
		if d := errorCount() - before; d != 1 {
			t.Errorf("%s: ratelimit_admin_token_file_errors_total grew by %v, want 1 (once, however many calls)", tt.name, d)
		}
		if l := logs.String()[mark:]; !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "every admin token is revoked") {
			t.Errorf("%s: no error log line:\n%s", tt.name, l)
		}
	}
	writeTokens(t, tokens, good)
	if a := status(alice); a != http.StatusOK || valid() != 1 {
		t.Errorf("file fixed: alice %d, valid %v; want 200, 1", a, valid())
	}
}

// metricValue gathers reg and returns the value of the one series of name
// (a gauge or a counter).
func metricValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			m := mf.GetMetric()[0]
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no single series %s", name)
	return 0
}
