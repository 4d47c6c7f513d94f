package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-rls/sluice/audit"
	"github.com/sluice-rls/sluice/internal/pkitest"
	"github.com/sluice-rls/sluice/node"
	"github.com/sluice-rls/sluice/override"
)

// overrideRules has a rule overrides may loosen and a protected one.
const overrideRules = "../../node/testdata/admin-rules.yaml"

// serveAdmin runs rls serve with overrideRules and an admin address on a
// free loopback port, with extra flags; it returns the admin address.
func serveAdmin(t *testing.T, extra ...string) string {
	t.Helper()
	rls := serveInProcess(t, noEnv, append(loopback("--config", overrideRules, "--admin-addr", "127.0.0.1:0"), extra...)...)
	addr, _ := rls.Serving()["admin_addr"].(string)
	return addr
}

// adminOverrides lists the overrides through GET /overrides.
func adminOverrides(t *testing.T, client *http.Client, url, token string) []override.Override {
	t.Helper()
	req, _ := http.NewRequest("GET", url+"/overrides", nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var l node.OverrideList
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /overrides: %d, %v", resp.StatusCode, err)
	}
	return l.Overrides
}

// TestOverrideCLIWithToken: rls override rm, set and list with a bearer
// token against a node's admin address.
func TestOverrideCLIWithToken(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("carol:carol-token-0123456789abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := serveAdmin(t, "--admin-token-file", tokens)
	body := `{"domain":"edge","rule":"edge.user_id","kind":"scale","factor":2,"reason":"promo","expires_in":"1h"}`
	req, _ := http.NewRequest("POST", "http://"+addr+"/overrides", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer carol-token-0123456789abc")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	l := adminOverrides(t, http.DefaultClient, "http://"+addr, "carol-token-0123456789abc")
	if len(l) != 1 {
		t.Fatalf("overrides %v, want the one just set", l)
	}

	// The CLI, in-process, with carol's token.
	ctok := filepath.Join(dir, "carol")
	if err := os.WriteFile(ctok, []byte("carol-token-0123456789abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	// Flags after the ID (on main: a usage error).
	if err := run(context.Background(), []string{"override", "rm", "--addr", addr, "--token-file", ctok, l[0].ID, "--reason", "promo over"}, &out, &errOut, noEnv); err != nil {
		t.Fatalf("rls override rm: %v\n%s", err, errOut.String())
	}
	out.Reset()
	err = run(context.Background(), []string{"override", "set", "--addr", addr, "--token-file", ctok, "--domain", "edge", "--value", "api_key=leaked", "--block", "--reason", "worm"}, &out, &errOut, noEnv)
	if err != nil || !strings.Contains(out.String(), "block on domain edge where api_key=leaked, by carol") {
		t.Errorf("rls override set --block: %v, printed %q", err, out.String())
	}
	err = run(context.Background(), []string{"override", "set", "--addr", addr, "--token-file", ctok, "--domain", "edge", "--rule", "edge.login", "--scale", "2", "--reason", "r"}, &out, &errOut, noEnv)
	if err == nil || exitCode(err) != 1 || !strings.Contains(err.Error(), "protected rule edge.login: cannot be scaled above 1") {
		t.Errorf("rls override set --scale 2 on a protected rule: %v (exit %d), want refused, exit 1", err, exitCode(err))
	}
	// Days in --expires (on main: invalid value "1d").
	out.Reset()
	err = run(context.Background(), []string{"override", "set", "--addr", addr, "--token-file", ctok, "--domain", "edge", "--rule", "edge.user_id", "--scale", "1.5", "--reason", "promo", "--expires", "1d"}, &out, &errOut, noEnv)
	if err != nil || !strings.Contains(out.String(), "scale") {
		t.Errorf("rls override set --expires 1d: %v, printed %q, %q", err, out.String(), errOut.String())
	}
	out.Reset()
	if err := run(context.Background(), []string{"override", "list", "--addr", addr, "--token-file", ctok}, &out, &errOut, noEnv); err != nil ||
		!strings.Contains(out.String(), "api_key=leaked") {
		t.Errorf("rls override list: %v, printed %q", err, out.String())
	}
	if err := run(context.Background(), []string{"override", "list", "--addr", addr}, &out, &errOut, noEnv); err == nil || exitCode(err) != 2 {
		t.Errorf("rls override list without a token: %v, want exit 2", err)
	}
}

// TestOverridesAuthorFromClientCertificate: with mTLS and no token file,
// the verified client certificate authenticates, its subject the author.
func TestOverridesAuthorFromClientCertificate(t *testing.T) {
	pki := pkitest.New(t)
	addr := serveAdmin(t, "--tls-cert", pki.ServerCert, "--tls-key", pki.ServerKey, "--admin-tls-client-ca", pki.CA)
	var out, errOut bytes.Buffer
	err := run(context.Background(), []string{"override", "set", "--addr", addr, "--tls-ca", pki.CA, "--tls-cert", pki.ClientCert, "--tls-key", pki.ClientKey,
		"--tls-server-name", pkitest.ServerName, "--domain", "edge", "--shadow", "--reason", "drill", "--expires", "1h"}, &out, &errOut, noEnv)
	if err != nil {
		t.Fatalf("rls override set over mTLS: %v\n%s", err, errOut.String())
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pki.Roots, Certificates: []tls.Certificate{pki.Client}, ServerName: pkitest.ServerName,
	}}}
	defer client.CloseIdleConnections()
	if l := adminOverrides(t, client, "https://"+addr, ""); len(l) != 1 || l[0].Author != "envoy" {
		t.Errorf("List() = %v, want one override by envoy (the certificate's CN)", l)
	}
}

// TestOverrideListEscapesText: rls override list (and set's and rm's
// line) prints reasons, authors and values escaped: no newline, carriage
// return or ANSI escape reaches the terminal raw (on main the reason was
// printed as it came).
func TestOverrideListEscapesText(t *testing.T) {
	evil := "ok\n\x1b[2J\x1b[31mFAKE ROW\r"
	l := node.OverrideList{
		Overrides: []override.Override{{ID: "abc", Domain: "edge", Value: "user_id=\x1b[1mx", Kind: override.KindBlock, Reason: evil, Author: "eve\x1b]0;t\x07"}},
		Malformed: []override.Malformed{{ID: "x\x1b[1m", Err: "bad\nline"}},
		Store:     "redis", StoreHealthy: true,
	}
	var out bytes.Buffer
	printOverrides(&out, l)
	got := out.String()
	if strings.ContainsAny(got, "\x1b\r\x07") || strings.Count(got, "\n") != 3 {
		t.Errorf("rls override list printed raw control characters:\n%q", got)
	}
	for _, want := range []string{`"ok\n\x1b[2J\x1b[31mFAKE ROW\r"`, `"eve\x1b]0;t\a"`, `"block"`[1:6], `"bad\nline"`} {
		if !strings.Contains(got, want) {
			t.Errorf("rls override list:\n%s\nwant %s", got, want)
		}
	}
	if s := l.Overrides[0].String(); strings.ContainsAny(s, "\x1b\r\n\x07") {
		t.Errorf("Override.String() = %q: raw control characters", s)
	}
	line := auditLine(audit.Event{Kind: audit.KindOverrideSet, Author: "eve\x1b[2J", Reason: "r\r", Changes: []audit.Change{{What: "domain edge where user_id=\x1b[1m", Old: "", New: "block"}}})
	if strings.ContainsAny(line, "\x1b\r") {
		t.Errorf("rls audit line %q: raw control characters", line)
	}
}

// TestOverrideHelp: rls override -h (or --help, help) prints the usage and
// exits 0 (on main: unknown subcommand, exit 2); a subcommand's -h too.
func TestOverrideHelp(t *testing.T) {
	for _, args := range [][]string{{"override", "-h"}, {"override", "--help"}, {"override", "help"}, {"override", "set", "-h"}} {
		code, stdout, stderr := runRLS(t, nil, args...)
		if code != 0 || !strings.Contains(stdout+stderr, "rls override set") || strings.Contains(stderr, "unknown subcommand") {
			t.Errorf("rls %q: exit %d, stdout %q, stderr %q; want the usage, exit 0", args, code, stdout, stderr)
		}
	}
	if code, _, stderr := runRLS(t, nil, "override", "sett"); code != 2 || !strings.Contains(stderr, `unknown subcommand "sett"`) {
		t.Errorf("rls override sett: exit %d, stderr %q; want unknown subcommand, exit 2", code, stderr)
	}
}
