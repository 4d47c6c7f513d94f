package descriptors

import "testing"

func TestLevelOf(t *testing.T) {
	t.Parallel()
	tests := []struct {
		d    Descriptor
		want level
	}{
		{Descriptor{Key: "k"}, level{key: "k", kind: keyOnly}},
		{Descriptor{Key: "k", Value: "v"}, level{key: "k", value: "v", kind: exact}},
		{Descriptor{Key: "k", Value: "v*", ShareThreshold: true, ValueToMetric: true},
			level{key: "k", value: "v*", kind: wildcard, share: true, valueToMetric: true}},
	}
	for _, tt := range tests {
		if got := levelOf(&tt.d); got != tt.want {
			t.Errorf("levelOf(%+v) = %+v, want %+v", tt.d, got, tt.want)
		}
	}
}

// TestTreeMergeKeepsBothSubtrees merges one domain from two files that
// share an intermediate node and checks both subtrees and the order of
// wildcards contributed by different files: load order, the first file's
// "*" before the second's "x*", so "*" wins (as envoyproxy/ratelimit's
// merge appends a file's wildcards to the level's list).
func TestTreeMergeKeepsBothSubtrees(t *testing.T) {
	t.Parallel()
	var files []*File
	for i, data := range []string{
		"domain: d\ndescriptors:\n  - key: r\n    value: /a\n    descriptors:\n      - {key: p, value: \"*\", rate_limit: {unit: second, requests_per_unit: 1}}\n",
		"domain: d\ndescriptors:\n  - key: r\n    value: /a\n    rate_limit: {unit: second, requests_per_unit: 2}\n    descriptors:\n      - {key: p, value: \"x*\", rate_limit: {unit: second, requests_per_unit: 3}}\n",
	} {
		f, err := Parse([]string{"one.yaml", "two.yaml"}[i], []byte(data))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	c, err := New(files, Options{MergeDomains: true})
	if err != nil {
		t.Fatal(err)
	}
	d := c.Domain("d")
	tests := []struct {
		req  []string
		want string
	}{
		{[]string{"r=/a"}, "d.r_/a"},
		{[]string{"r=/a", "p=xy"}, "d.r_/a.p_*"},
		{[]string{"r=/a", "p=yy"}, "d.r_/a.p_*"},
	}
	for _, tt := range tests {
		got := d.Match(entries(tt.req...))
		if got == nil || got.Path != tt.want {
			t.Errorf("Match(%v) = %v, want %s", tt.req, got, tt.want)
		}
	}
	if got := d.Match(entries("r=/a")).Source(); got != "two.yaml:3:10" {
		t.Errorf("merged rule Source() = %s, want two.yaml:3:10", got)
	}
}
