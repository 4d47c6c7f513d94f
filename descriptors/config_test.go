package descriptors

import (
	"slices"
	"strings"
	"testing"
)

func TestNewAcrossFiles(t *testing.T) {
	t.Parallel()
	const a = "domain: d\ndescriptors:\n  - key: route\n    value: /a\n    descriptors:\n      - key: user\n        rate_limit: {unit: second, requests_per_unit: 1, name: base}\n"
	const b = "# team b\ndomain: d\ndescriptors:\n  - key: route\n    value: /a\n    descriptors:\n      - key: ip\n        rate_limit: {unit: second, requests_per_unit: 2, replaces: [{name: base}]}\n"
	const c = "domain: d\ndescriptors:\n  - key: route\n    value: /a\n    descriptors:\n      - key: user\n        rate_limit: {unit: second, requests_per_unit: 3}\n"
	const e = "domain: d\ndescriptors:\n  - key: route\n    value: /a\n    value_to_metric: true\n"
	tests := []struct {
		name     string
		files    []*File
		opts     Options
		wantErr  string // empty: success
		wantWarn string // with success: one warning, exactly this
		rules    int
	}{
		{name: "duplicate domain blames second file", files: []*File{mustParse(t, "a.yaml", a), mustParse(t, "b.yaml", b)},
			wantErr: `b.yaml:2:9: duplicate domain "d" (first defined in a.yaml:1:9); merging is off`},
		{name: "merge shares intermediate nodes", files: []*File{mustParse(t, "a.yaml", a), mustParse(t, "b.yaml", b)},
			opts: Options{MergeDomains: true}, rules: 2},
		{name: "merge rejects two rate limits on one node", files: []*File{mustParse(t, "a.yaml", a), mustParse(t, "c.yaml", c)},
			opts: Options{MergeDomains: true}, wantErr: `c.yaml:6:14: duplicate descriptor key "user" with a rate_limit (first at a.yaml:6:14)`},
		{name: "merge rejects conflicting level flags", files: []*File{mustParse(t, "a.yaml", a), mustParse(t, "e.yaml", e)},
			opts: Options{MergeDomains: true}, wantErr: `e.yaml:3:10: descriptor key "route" value "/a" disagrees on value_to_metric or share_threshold with a.yaml:3:10`},
		{name: "replaces resolved across merged files", files: []*File{mustParse(t, "b.yaml", b), mustParse(t, "a.yaml", a)},
			opts: Options{MergeDomains: true}, rules: 2},
		{name: "replaces unknown without the other file", files: []*File{mustParse(t, "b.yaml", b)}, rules: 1,
			wantWarn: `b.yaml:8:76: replaces "base", but no rate_limit in domain "d" has that name, so it replaces nothing (as in envoyproxy/ratelimit)`},
		{name: "nil files skipped", files: []*File{nil, mustParse(t, "a.yaml", a)}, rules: 1},
		{name: "hand-built file is validated", files: []*File{{Name: "hand", Descriptors: []Descriptor{{Key: "k"}}}},
			wantErr: "hand: domain is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := New(tt.files, tt.opts)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("New() error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("New() error = %v", err)
			}
			if c.Len() != tt.rules {
				t.Errorf("New().Len() = %d, want %d", c.Len(), tt.rules)
			}
			var warns []string
			for _, w := range c.Warnings() {
				warns = append(warns, w.Error())
			}
			if want := []string{tt.wantWarn}; tt.wantWarn == "" && len(warns) > 0 || tt.wantWarn != "" && !slices.Equal(warns, want) {
				t.Errorf("New().Warnings() = %q, want %q", warns, tt.wantWarn)
			}
		})
	}
}

func TestConfigRulesSorted(t *testing.T) {
	t.Parallel()
	c, err := New([]*File{
		mustParse(t, "z.yaml", "domain: zeta\ndescriptors:\n  - {key: b, rate_limit: {unit: second, requests_per_unit: 1}}\n  - {key: a, descriptors: [{key: x}]}\n"),
		mustParse(t, "a.yaml", "domain: alpha\ndescriptors:\n  - {key: z, rate_limit: {unlimited: true}}\n  - {key: a, rate_limit: {unit: second, requests_per_unit: 1}}\n"),
	}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, r := range c.Rules() {
		paths = append(paths, r.Path)
	}
	want := []string{"alpha.a", "alpha.z", "zeta.b"}
	if !slices.Equal(paths, want) {
		t.Errorf("Rules() paths = %q, want %q (rules without rate_limit left out)", paths, want)
	}
	if c.Len() != 3 {
		t.Errorf("Len() = %d, want 3", c.Len())
	}
	if got := c.Domains(); !slices.Equal(got, []string{"alpha", "zeta"}) {
		t.Errorf("Domains() = %q, want [alpha zeta]", got)
	}
	if got := c.Domain("alpha").Rules(); len(got) != 2 || got[0].Path != "alpha.a" {
		t.Errorf("Domain(alpha).Rules() = %v, want alpha.a, alpha.z", got)
	}
	if c.Domain("beta") != nil {
		t.Errorf("Domain(beta) != nil, want nil for an unknown domain")
	}
}
