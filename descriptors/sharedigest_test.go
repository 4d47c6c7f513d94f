package descriptors

import (
	"strings"
	"testing"
)

// TestShareDigest: the digest changes with a rule's share as the node
// resolves it (its own, the default, none for a charge), with the rules
// that hold one and their names, and with nothing else.
func TestShareDigest(t *testing.T) {
	t.Parallel()
	const base = `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 10, share: 0.5}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: c
    postpaid: true
    rate_limit: {unit: second, requests_per_unit: 10}
`
	digest := func(yaml string, def uint32) uint64 { t.Helper(); return mustConfig(t, yaml).ShareDigest(def) }
	d := digest(base, 0)
	if d == 0 {
		t.Fatal("a rule with a share: digest 0")
	}
	for _, c := range []struct {
		name string
		yaml string
		def  uint32
		same bool
	}{
		{"again", base, 0, true},
		{"another limit and a rule without a share", `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 99, burst: 7, share: 0.5}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 20}
  - key: e
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: c
    postpaid: true
    rate_limit: {unit: second, requests_per_unit: 10}
`, 0, true},
		{"a rule with share 0", base + `  - key: z
    rate_limit: {unit: second, requests_per_unit: 10, share: 0}
`, 0, true},
		{"another share", `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 10, share: 0.25}
`, 0, false},
		{"the default", base, 250_000, false},
		{"another domain", `
domain: e
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 10, share: 0.5}
`, 0, false},
		{"another path", `
domain: d
descriptors:
  - key: a
    value: v
    rate_limit: {unit: second, requests_per_unit: 10, share: 0.5}
`, 0, false},
	} {
		if got := digest(c.yaml, c.def) == d; got != c.same {
			t.Errorf("%s: same digest %v, want %v", c.name, got, c.same)
		}
	}
	// The default as the rule would set it: b takes it, the charge c does not.
	own := strings.Replace(base, "key: b\n    rate_limit: {", "key: b\n    rate_limit: {share: 0.25, ", 1)
	if digest(own, 0) != digest(base, 250_000) {
		t.Error("the default --share 0.25: digest differs from b's own share 0.25")
	}
	if got := digest("domain: d\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 10}\n", 0); got != 0 {
		t.Errorf("no rule with a share: digest %x, want 0", got)
	}
	var nilConfig *Config
	if got := nilConfig.ShareDigest(500_000); got != 0 {
		t.Errorf("no rules: digest %x, want 0", got)
	}
}
