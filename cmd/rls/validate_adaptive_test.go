package main

import (
	"path/filepath"
	"strings"
	"testing"
)

const adaptiveRules = `domain: edge
descriptors:
  - key: user_id
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: admin
    protected: true
    rate_limit: {unit: second, requests_per_unit: 10}
`

// adaptivePolicy is a file of one step policy on scope domain (and rule,
// unless empty), with max_scale maxScale.
func adaptivePolicy(domain, rule, maxScale string) string {
	s := "prometheus: http://prometheus:9090\npolicies:\n  - name: latency\n    domain: " + domain + "\n"
	if rule != "" {
		s += "    rule: " + rule + "\n"
	}
	return s + "    max_scale: " + maxScale + "\n    signals: [{name: p99, query: p99, lower_above: 1, raise_below: 0.2}]\n"
}

// TestValidateAdaptiveConfig: --adaptive-config (or RLS_ADAPTIVE_CONFIG)
// checks an adaptive-limits file as serve reads it, alone or with the
// rules; each problem is printed as file:line: reason (exit 1), a file
// that cannot be read is a usage error (exit 2), and with rules a policy
// scaling nothing or asking to raise a protected rule is a warning, which
// --strict fails.
func TestValidateAdaptiveConfig(t *testing.T) {
	dir := t.TempDir()
	rules := writeRuleFile(t, dir, "rules.yaml", adaptiveRules)
	good := writeRuleFile(t, dir, "good.yaml", adaptivePolicy("edge", "edge.user_id", "1"))

	if code, stdout, stderr := runRLS(t, nil, "validate", "--adaptive-config", good); code != 0 || stdout != good+": ok, 1 policies\n" {
		t.Errorf("validate --adaptive-config good.yaml: exit %d, stdout %q, stderr %q; want ok, 1 policies", code, stdout, stderr)
	}
	env := map[string]string{"RLS_ADAPTIVE_CONFIG": good}
	if code, stdout, stderr := runRLS(t, env, "validate", rules); code != 0 || stdout != rules+": ok, 2 rules\n"+good+": ok, 1 policies\n" {
		t.Errorf("RLS_ADAPTIVE_CONFIG=good.yaml validate rules.yaml: exit %d, stdout %q, stderr %q; want both ok", code, stdout, stderr)
	}

	bad := writeRuleFile(t, dir, "bad.yaml", "prometheus: http://prometheus:9090\npolicies:\n  - name: latency\n    domain: edge\n    min_scale: 2\n    signals:\n      - {name: p99, query: p99, lower_above: 1, raise_below: 3}\n")
	code, stdout, stderr := runRLS(t, nil, "validate", rules, "--adaptive-config", bad)
	for _, want := range []string{
		bad + `:5: policy "latency": min_scale must be above 0 and at most 1, not 2`,
		bad + `:7: policy "latency": signal "p99": raise_below (3) must be below lower_above (1)`,
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("validate rules.yaml --adaptive-config bad.yaml: stderr %q lacks %q", stderr, want)
		}
	}
	if code != 1 || stdout != "" {
		t.Errorf("validate rules.yaml --adaptive-config bad.yaml: exit %d, stdout %q; want exit 1, nothing ok", code, stdout)
	}
	typo := writeRuleFile(t, dir, "typo.yaml", "prometheus: http://prometheus:9090\npolicies:\n  - name: latency\n    domian: edge\n")
	if code, _, stderr := runRLS(t, nil, "validate", "--adaptive-config", typo); code != 1 || !strings.Contains(stderr, typo+":4: field domian not found") {
		t.Errorf("validate --adaptive-config typo.yaml: exit %d, stderr %q; want exit 1 at line 4", code, stderr)
	}
	missing := filepath.Join(dir, "missing.yaml")
	if code, _, stderr := runRLS(t, nil, "validate", rules, "--adaptive-config", missing); code != 2 || !strings.Contains(stderr, "missing.yaml") {
		t.Errorf("validate --adaptive-config missing.yaml: exit %d, stderr %q; want exit 2 naming the file", code, stderr)
	}

	for _, tc := range []struct{ name, file, warning string }{
		{"no domain", adaptivePolicy("api", "", "1"), `the rules have no domain "api"`},
		{"no rule", adaptivePolicy("edge", "edge.user", "1"), `domain "edge" has no rule "edge.user"`},
		{"protected", adaptivePolicy("edge", "edge.admin", "2"), `max_scale 2: rule "edge.admin" is protected and is never scaled above 1`},
	} {
		f := writeRuleFile(t, dir, strings.ReplaceAll(tc.name, " ", "-")+".yaml", tc.file)
		code, stdout, stderr := runRLS(t, nil, "validate", rules, "--adaptive-config", f)
		if code != 0 || !strings.Contains(stderr, "warning: "+f+`: policy "latency": `+tc.warning) || !strings.Contains(stdout, f+": ok, 1 policies, 1 warnings") {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want ok with the warning %q", tc.name, code, stdout, stderr, tc.warning)
		}
		if code, _, stderr := runRLS(t, nil, "validate", "--strict", rules, "--adaptive-config", f); code != 1 || !strings.Contains(stderr, "1 warnings (--strict)") {
			t.Errorf("%s --strict: exit %d, stderr %q; want exit 1", tc.name, code, stderr)
		}
		// Alone, the file has no rules to be checked against.
		if code, _, stderr := runRLS(t, nil, "validate", "--strict", "--adaptive-config", f); code != 0 || strings.Contains(stderr, "warning") {
			t.Errorf("%s alone --strict: exit %d, stderr %q; want ok", tc.name, code, stderr)
		}
	}
	if code, _, stderr := runRLS(t, nil, "validate"); code != 2 || !strings.Contains(stderr, "--adaptive-config") {
		t.Errorf("validate without anything: exit %d, stderr %q; want a usage error naming --adaptive-config", code, stderr)
	}
}

// TestServeRefusesABadAdaptiveConfig: rls serve stops on the file
// validate refuses, listing every problem with its line.
func TestServeRefusesABadAdaptiveConfig(t *testing.T) {
	dir := t.TempDir()
	rules := writeRuleFile(t, dir, "rules.yaml", adaptiveRules)
	bad := writeRuleFile(t, dir, "bad.yaml", "prometheus: http://127.0.0.1:1\npolicies:\n  - name: latency\n    domain: edge\n    min_scale: 2\n    signals:\n      - {name: p99, query: p99, lower_above: 1, raise_below: 3}\n")
	code, _, stderr := runRLS(t, nil, "serve", "--config", rules, "--adaptive-config", bad, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", "")
	if code != 1 || !strings.Contains(stderr, "--adaptive-config: ") || !strings.Contains(stderr, bad+":5: ") || !strings.Contains(stderr, bad+":7: ") {
		t.Errorf("serve --adaptive-config bad.yaml: exit %d, stderr %q; want exit 1 naming both problems", code, stderr)
	}
}
