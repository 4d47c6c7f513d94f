package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-rls/sluice/ruleset"
)

// domainRules is a rule file of domain with one rule, key k.
func domainRules(domain, key string) string {
	return "domain: " + domain + "\ndescriptors:\n  - key: " + key + "\n    rate_limit: {unit: second, requests_per_unit: 1}\n"
}

func writeRuleFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// runRLS runs one rls command in-process and returns its exit code, stdout
// and stderr (with the error main would print).
func runRLS(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(context.Background(), args, &out, &errOut, func(k string) string { return env[k] })
	if err != nil {
		code = exitCode(err)
		if !strings.Contains(errOut.String(), err.Error()) {
			errOut.WriteString("rls: " + err.Error() + "\n")
		}
	}
	return code, out.String(), errOut.String()
}

// TestValidateChecksArgumentsAsOneSet: two files defining one domain pass
// when each is checked alone, but serve refuses them together; validate
// must refuse them too, naming the second file.
func TestValidateChecksArgumentsAsOneSet(t *testing.T) {
	dir := t.TempDir()
	a := writeRuleFile(t, dir, "a.yaml", domainRules("d", "ka"))
	b := writeRuleFile(t, dir, "b.yaml", domainRules("d", "kb"))

	code, stdout, stderr := runRLS(t, nil, "validate", a, b)
	if code != 1 || !strings.Contains(stderr, b) || !strings.Contains(stderr, `"d"`) {
		t.Errorf("validate a.yaml b.yaml: exit %d, stdout %q, stderr %q; want exit 1 naming b.yaml and domain d", code, stdout, stderr)
	}
	code, _, serveErr := runRLS(t, nil, "serve", "--config", dir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", "")
	if code == 0 || !strings.Contains(serveErr, b) {
		t.Errorf("serve --config dir: exit %d, stderr %q; want it to refuse b.yaml as validate does", code, serveErr)
	}
	// Files of different domains are one set too: one line for the set.
	c := writeRuleFile(t, t.TempDir(), "c.yaml", domainRules("e", "kc"))
	code, stdout, stderr = runRLS(t, nil, "validate", a, c)
	if code != 0 || stdout != a+", "+c+": ok, 2 rules\n" {
		t.Errorf("validate a.yaml c.yaml: exit %d, stdout %q, stderr %q; want one ok line for 2 rules", code, stdout, stderr)
	}
}

// TestValidateMergeDomains: a directory that serve --merge-domains accepts
// passes validate --merge-domains (and RLS_MERGE_DOMAINS, as serve reads
// it), and fails without it.
func TestValidateMergeDomains(t *testing.T) {
	dir := t.TempDir()
	writeRuleFile(t, dir, "a.yaml", domainRules("d", "ka"))
	writeRuleFile(t, dir, "b.yaml", domainRules("d", "kb"))

	if code, stdout, stderr := runRLS(t, nil, "validate", "--merge-domains", dir); code != 0 || !strings.Contains(stdout, "ok, 2 rules") {
		t.Errorf("validate --merge-domains dir: exit %d, stdout %q, stderr %q; want ok, 2 rules", code, stdout, stderr)
	}
	env := map[string]string{"RLS_MERGE_DOMAINS": "true"}
	if code, stdout, stderr := runRLS(t, env, "validate", dir); code != 0 || !strings.Contains(stdout, "ok, 2 rules") {
		t.Errorf("RLS_MERGE_DOMAINS=true validate dir: exit %d, stdout %q, stderr %q; want ok, 2 rules", code, stdout, stderr)
	}
	if code, _, stderr := runRLS(t, nil, "validate", dir); code != 1 || !strings.Contains(stderr, "b.yaml") {
		t.Errorf("validate dir without --merge-domains: exit %d, stderr %q; want exit 1 naming b.yaml", code, stderr)
	}
	// Flags may follow the paths; after --, a flag is a path.
	if code, stdout, stderr := runRLS(t, nil, "validate", dir, "--merge-domains"); code != 0 || !strings.Contains(stdout, "ok, 2 rules") {
		t.Errorf("validate dir --merge-domains: exit %d, stdout %q, stderr %q; want ok, 2 rules", code, stdout, stderr)
	}
	if code, _, stderr := runRLS(t, nil, "validate", dir, "--", "--merge-domains"); code != 2 || !strings.Contains(stderr, "--merge-domains: no such file") {
		t.Errorf("validate dir -- --merge-domains: exit %d, stderr %q; want --merge-domains read as a missing path (exit 2)", code, stderr)
	}
}

// TestValidateLoadingFlags: validate reads --max-rule-bytes and --config
// as serve does.
func TestValidateLoadingFlags(t *testing.T) {
	dir := t.TempDir()
	a := writeRuleFile(t, dir, "a.yaml", domainRules("d", "ka"))
	other := writeRuleFile(t, t.TempDir(), "other.yaml", domainRules("e", "ke"))

	if code, _, stderr := runRLS(t, nil, "validate", "--max-rule-bytes", "10", a); code != 1 || !strings.Contains(stderr, "--max-rule-bytes") || !strings.Contains(stderr, a) {
		t.Errorf("validate --max-rule-bytes 10: exit %d, stderr %q; want exit 1 naming a.yaml and --max-rule-bytes", code, stderr)
	}
	if code, stdout, stderr := runRLS(t, nil, "validate", "--config", dir); code != 0 || stdout != dir+": ok, 1 rules\n" {
		t.Errorf("validate --config dir: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	env := map[string]string{"RLS_CONFIG": dir}
	if code, stdout, stderr := runRLS(t, env, "validate"); code != 0 || stdout != dir+": ok, 1 rules\n" {
		t.Errorf("RLS_CONFIG=dir validate: exit %d, stdout %q, stderr %q; want dir checked", code, stdout, stderr)
	}
	if code, stdout, stderr := runRLS(t, env, "validate", other); code != 0 || stdout != other+": ok, 1 rules\n" {
		t.Errorf("RLS_CONFIG=dir validate other.yaml: exit %d, stdout %q, stderr %q; want other.yaml alone (arguments win)", code, stdout, stderr)
	}
	if code, _, stderr := runRLS(t, nil, "validate", "--config", dir, other); code != 2 || !strings.Contains(stderr, "not both") {
		t.Errorf("validate --config dir other.yaml: exit %d, stderr %q; want a usage error", code, stderr)
	}
}

func TestValidateHelp(t *testing.T) {
	for _, h := range []string{"-h", "--help"} {
		code, stdout, stderr := runRLS(t, nil, "validate", h)
		out := stdout + stderr
		if code != 0 || !strings.Contains(out, "usage: rls validate") || !strings.Contains(out, "-merge-domains") || !strings.Contains(out, "-max-rule-bytes") {
			t.Errorf("validate %s: exit %d, output %q; want exit 0 and the usage with the loading flags", h, code, out)
		}
		if strings.Contains(out, "no such file") {
			t.Errorf("validate %s read %s as a rule file: %q", h, h, out)
		}
	}
}

// TestValidateWarnings: a file envoyproxy/ratelimit loads but sluice finds
// suspect passes, with each warning printed at its position; --strict
// (or RLS_STRICT) fails on it, for CI. A rule keyed on the gray key warns
// by --gray-key's name, and not once the marker is off.
func TestValidateWarnings(t *testing.T) {
	dir := t.TempDir()
	peer := writeRuleFile(t, dir, "peer.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n")
	const unitWarning = ":5:13: rate_limit has a unit but no requests_per_unit"

	code, stdout, stderr := runRLS(t, nil, "validate", peer)
	if code != 0 || stdout != peer+": ok, 1 rules, 1 warnings\n" || !strings.Contains(stderr, "warning: "+peer+unitWarning) {
		t.Errorf("validate peer.yaml: exit %d, stdout %q, stderr %q; want exit 0, the warning and ok, 1 rules, 1 warnings", code, stdout, stderr)
	}
	for _, env := range []map[string]string{nil, {"RLS_STRICT": "true"}} {
		args := []string{"validate", "--strict", peer}
		if env != nil {
			args = []string{"validate", peer}
		}
		code, stdout, stderr = runRLS(t, env, args...)
		if code != 1 || stdout != "" || !strings.Contains(stderr, peer+unitWarning) || !strings.Contains(stderr, "1 warnings (--strict)") {
			t.Errorf("%v %v: exit %d, stdout %q, stderr %q; want exit 1 with the warning", env, args, code, stdout, stderr)
		}
	}

	gray := writeRuleFile(t, t.TempDir(), "gray.yaml", domainRules("d", "gray"))
	if code, _, stderr := runRLS(t, nil, "validate", "--strict", gray); code != 1 || !strings.Contains(stderr, gray+`:3:10: descriptor key "gray" is the gray key`) || !strings.Contains(stderr, "--gray-key") {
		t.Errorf("validate --strict gray.yaml: exit %d, stderr %q; want exit 1 warning about --gray-key", code, stderr)
	}
	if code, stdout, stderr := runRLS(t, nil, "validate", "--strict", "--gray-key", "", gray); code != 0 || stdout != gray+": ok, 1 rules\n" {
		t.Errorf("validate --strict --gray-key '' gray.yaml: exit %d, stdout %q, stderr %q; want ok: the marker is off", code, stdout, stderr)
	}
}

// TestValidateDefaultRules: the embedded example rules (what serve loads
// without --config) load without a warning.
func TestValidateDefaultRules(t *testing.T) {
	path := writeRuleFile(t, t.TempDir(), "default.yaml", string(ruleset.DefaultRules()))
	if code, stdout, stderr := runRLS(t, nil, "validate", "--strict", path); code != 0 || !strings.Contains(stdout, ": ok,") {
		t.Errorf("validate --strict <embedded rules>: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
}

// TestValidateWarningsWithErrors: when a rule set has errors, its warnings
// are printed too (on main they were hidden until the errors were fixed),
// those of the file in error as those of the others; --strict after the
// path is a flag (on main it was read as a missing file).
func TestValidateWarningsWithErrors(t *testing.T) {
	dir := t.TempDir()
	peer := writeRuleFile(t, dir, "peer.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n")
	bad := writeRuleFile(t, dir, "bad.yaml", "domain: e\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n  - key: x\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	code, _, stderr := runRLS(t, nil, "validate", peer, bad, "--strict")
	if code != 1 || !strings.Contains(stderr, "fortnight") {
		t.Fatalf("validate peer.yaml bad.yaml --strict: exit %d, stderr %q; want exit 1 naming the bad unit", code, stderr)
	}
	for _, f := range []string{peer, bad} {
		if !strings.Contains(stderr, "warning: "+f+":5:13: rate_limit has a unit but no requests_per_unit") {
			t.Errorf("validate with an error: stderr %q lacks the warning of %s", stderr, f)
		}
	}
}

// TestValidateExitCodes: a rule problem exits 1; a path that cannot be
// read is the command line's mistake and exits 2, as a usage error (on
// main: 1).
func TestValidateExitCodes(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.yaml")
	if code, _, stderr := runRLS(t, nil, "validate", missing); code != 2 || !strings.Contains(stderr, "missing.yaml") {
		t.Errorf("validate missing.yaml: exit %d, stderr %q; want exit 2 naming the file", code, stderr)
	}
	bad := writeRuleFile(t, dir, "bad.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	if code, _, stderr := runRLS(t, nil, "validate", bad); code != 1 || !strings.Contains(stderr, "fortnight") {
		t.Errorf("validate bad.yaml: exit %d, stderr %q; want exit 1", code, stderr)
	}
}

// TestValidateWarnsOfUnknownRLSVariables: a mistyped RLS_* variable is
// named on stderr (on main it was ignored without a word).
func TestValidateWarnsOfUnknownRLSVariables(t *testing.T) {
	t.Setenv("RLS_STIRCT", "true")
	path := writeRuleFile(t, t.TempDir(), "a.yaml", domainRules("d", "ka"))
	if code, _, stderr := runRLS(t, nil, "validate", path); code != 0 || !strings.Contains(stderr, "RLS_STIRCT is set, but no flag reads it: did you mean RLS_STRICT?") {
		t.Errorf("RLS_STIRCT=true validate: exit %d, stderr %q; want a warning naming RLS_STRICT", code, stderr)
	}
}
