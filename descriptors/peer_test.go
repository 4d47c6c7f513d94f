package descriptors

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestPeerFiles loads every testdata/peer/*.yaml: rule files that
// envoyproxy/ratelimit loads but sluice finds suspect. Each must load, with
// exactly the warnings listed (file:line:column: reason), and decide as the
// peer does: each request ("domain key=value ...") must match the rule
// whose /rlconfig line (Rule.String) is given, "" for no match. The files
// are loaded with the gray key on, as `rls serve` by default. Every
// fixture must appear here, and vice versa.
func TestPeerFiles(t *testing.T) {
	t.Parallel()
	type request struct{ req, want string }
	type peerCase struct {
		warnings []string
		requests []request
	}
	tests := map[string]peerCase{
		"unit_without_rpu": {
			warnings: []string{"unit_without_rpu.yaml:5:13: rate_limit has a unit but no requests_per_unit: the limit is 0, so every request is over it (as in envoyproxy/ratelimit); write requests_per_unit: 0 to say so"},
			requests: []request{{"x a=1", "x.a: global 0/second burst 0"}},
		},
		"unlimited_with_rpu": {
			warnings: []string{"unlimited_with_rpu.yaml:6:26: requests_per_unit is ignored: the rate_limit is unlimited (as in envoyproxy/ratelimit); remove one of them"},
			requests: []request{{"x a=1", "x.a: unlimited"}},
		},
		"unlimited_bad_unit": {
			warnings: []string{`unlimited_bad_unit.yaml:5:13: unit "fortnight" is not a unit; ignored: the rate_limit is unlimited (as in envoyproxy/ratelimit); remove it`},
			requests: []request{{"x a=1", "x.a: unlimited"}},
		},
		"path_dots": {
			warnings: []string{`path_dots.yaml:7:14: rule path "x.a.b" is also the path of the rule at path_dots.yaml:3:10: metrics, /rlconfig and reload logs cannot tell them apart; rename a key or value`},
			requests: []request{
				{"x a.b=1", "x.a.b: global 1/second burst 1"},
				{"x a=1 b=2", "x.a.b: global 2/second burst 2"},
			},
		},
		"replaces_unknown": {
			warnings: []string{`replaces_unknown.yaml:13:17: replaces "a_limt", but no rate_limit in domain "x" has that name, so it replaces nothing (as in envoyproxy/ratelimit)`},
			requests: []request{{"x b=1", "x.b: global 5/second burst 5, replaces a_limt"}},
		},
		"duplicate_field": {
			warnings: []string{`duplicate_field.yaml:7:7: duplicate field "unit" in rate_limit (first at 5:7): this one counts, as in envoyproxy/ratelimit; write it once`},
			requests: []request{{"x a=1", "x.a: global 5/minute burst 5"}},
		},
		"duplicate_rate_limit": {
			warnings: []string{
				`duplicate_rate_limit.yaml:5:5: duplicate field "rate_limit" in a descriptor (first at 4:5): the two are combined, this one's fields winning, as envoyproxy/ratelimit does; write it once`,
				`duplicate_rate_limit.yaml:8:5: duplicate field "value" in a descriptor (first at 7:5): this one counts, as in envoyproxy/ratelimit; write it once`,
			},
			requests: []request{
				{"x a=1", "x.a: global 7/second burst 7, name first"},
				{"x b=two", "x.b_two: global 1/hour burst 1"},
				{"x b=one", ""},
			},
		},
		"duplicate_metadata_key": {
			warnings: []string{`duplicate_metadata_key.yaml:4:29: duplicate key "pool" in metadata (first at 4:16): this one counts, as in envoyproxy/ratelimit; write it once`},
			requests: []request{{"x a=1", "x.a: global 1/second burst 1"}}, // Metadata: TestPeerDuplicateMetadataKey
		},
		"misplaced_field": {
			warnings: []string{
				`misplaced_field.yaml:4:5: "unit" is not a field of a descriptor: ignored, as envoyproxy/ratelimit ignores a field it knows in the wrong place`,
				`misplaced_field.yaml:8:7: "shadow_mode" is not a field of rate_limit: ignored, as envoyproxy/ratelimit ignores a field it knows in the wrong place`,
			},
			requests: []request{{"x a=1", "x.a: global 5/minute burst 5"}}, // enforced: no shadow_mode
		},
		"two_documents": {
			warnings: []string{"two_documents.yaml:5:1: more than one YAML document in the file: only the first is loaded, as envoyproxy/ratelimit does"},
			requests: []request{{"x a=1", "x.a: global 1/second burst 1"}, {"y b=1", ""}},
		},
		"wildcard_order": {
			warnings: []string{`wildcard_order.yaml:7:12: wildcard value "/api/v1/*" never matches: the earlier "/api/*" (wildcard_order.yaml:3:10) matches every value it does, and the first matching wildcard in file order wins (as in envoyproxy/ratelimit); put the narrower pattern first`},
			requests: []request{
				{"x path=/api/v1/orders", "x.path_/api/v1/orders: global 3/second burst 3"}, // exact beats wildcard
				{"x path=/api/v1/users", "x.path_/api/*: global 1/second burst 1"},          // first in file order, not the most literal
				{"x path=/other", "x.path: global 4/second burst 4"},                        // wildcard beats key-only; none matches
				{"x file=/api/v1/a.json", "x.file_*.json: global 5/second burst 5"},         // first in file order
				{"x file=/api/v1/a.csv", "x.file_/api/v1/*: global 6/second burst 6"},
			},
		},
		"gray_key": {
			warnings: []string{
				`gray_key.yaml:3:10: descriptor key "gray" is the gray key: sluice removes "gray" entries from requests before matching, so this rule never matches; give --gray-key another key, or --gray-key "" to turn the gray marker off`,
				`gray_key.yaml:8:14: descriptor key "gray" is the gray key: sluice removes "gray" entries from requests before matching, so this rule never matches; give --gray-key another key, or --gray-key "" to turn the gray marker off`,
			},
		},
	}
	runFixtures(t, "testdata/peer", tests, func(t *testing.T, path string, data []byte, tt peerCase) {
		f, err := Parse(filepath.Base(path), data)
		if err != nil {
			t.Fatalf("Parse(%s): %v; want it to load", path, err)
		}
		c, err := New([]*File{f}, Options{GrayKey: "gray"})
		if err != nil {
			t.Fatalf("New(%s): %v; want it to load", path, err)
		}
		var got []string
		for _, w := range c.Warnings() {
			got = append(got, w.Error())
		}
		if !slices.Equal(got, tt.warnings) {
			t.Errorf("Warnings() =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.warnings, "\n"))
		}
		for _, r := range tt.requests {
			fields := strings.Fields(r.req)
			got := ""
			if rule := c.Domain(fields[0]).Match(entries(fields[1:]...)); rule != nil {
				got = rule.String()
			}
			if got != r.want {
				t.Errorf("Match(%s) = %q, want %q", r.req, got, r.want)
			}
		}

	})
}

// TestManyDuplicatesCapped: a field repeated many times costs linear time
// (repeated mappings are combined in place) and at most 100 warnings are
// kept, one of them counting the rest.
func TestManyDuplicatesCapped(t *testing.T) {
	t.Parallel()
	const n = 20000
	data := "domain: d\ndescriptors:\n  - key: k\n" + strings.Repeat("    rate_limit: {unit: second, requests_per_unit: 1}\n", n)
	f, err := Parse("many.yaml", []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	c, err := New([]*File{f}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	w := c.Warnings()
	if len(w) != maxErrors || w[0].Reason != fmt.Sprintf("%d more warnings not shown", n-maxErrors) || w[len(w)-1].Line == 0 {
		t.Errorf("Warnings() = %d lines, first %v; want %d with a count of the rest first", len(w), w[0], maxErrors)
	}
}

// TestPeerDuplicateMetadataKey: a key repeated in metadata keeps its last
// value, as envoyproxy/ratelimit's yaml.v2 decoding of a map does.
func TestPeerDuplicateMetadataKey(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("testdata/peer/duplicate_metadata_key.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c := mustConfig(t, string(data))
	if got := c.Domain("x").Match(entries("a=1")).Metadata["pool"]; got != "second" {
		t.Errorf("metadata pool = %v, want second (the last)", got)
	}
}
