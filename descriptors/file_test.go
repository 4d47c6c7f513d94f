package descriptors

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"gopkg.in/yaml.v3"
)

func u32(v uint32) *uint32 { return &v }

// ignorePositions compares Files by content only.
var ignorePositions = cmpopts.IgnoreUnexported(File{}, Descriptor{}, RateLimit{}, Replace{}, LocalLimit{})

func TestParseDesignExample(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("testdata/edge.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got, err := Parse("edge.yaml", data)
	if err != nil {
		t.Fatalf("Parse(edge.yaml) error = %v", err)
	}
	want := &File{
		Name:   "edge.yaml",
		Domain: "edge",
		Descriptors: []Descriptor{
			{Key: "remote_address", RateLimit: &RateLimit{
				Unit: Second, RequestsPerUnit: u32(1000), Burst: u32(2000),
				Local: &LocalLimit{Unit: Second, RequestsPerUnit: u32(3200), Burst: u32(64)},
			}},
			{Key: "user_id", RateLimit: &RateLimit{Unit: Second, RequestsPerUnit: u32(100), Burst: u32(200)}},
			{Key: "route", Value: "/api/orders", Descriptors: []Descriptor{
				{Key: "user_id", RateLimit: &RateLimit{Unit: Second, RequestsPerUnit: u32(10), Name: "orders_per_user"}},
			}},
			{Key: "remote_address", Value: "50.0.0.5", RateLimit: &RateLimit{Unit: Second, RequestsPerUnit: u32(0)}},
			{Key: "health", RateLimit: &RateLimit{Unlimited: true}},
			{Key: "tenant", RateLimit: &RateLimit{Local: &LocalLimit{Unit: Second, RequestsPerUnit: u32(50)}}},
		},
	}
	if diff := cmp.Diff(want, got, ignorePositions); diff != "" {
		t.Errorf("Parse(edge.yaml) mismatch (-want +got):\n%s", diff)
	}
}

func TestParseAccepts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		yaml string
		want *File
	}{
		{
			name: "scalars of any type are strings, as written",
			yaml: "domain: 123\ndescriptors:\n  - key: 0x10\n    value: 007\n    rate_limit: {unit: Second, requests_per_unit: 0x10}\n",
			want: &File{Domain: "123", Descriptors: []Descriptor{{Key: "0x10", Value: "007",
				RateLimit: &RateLimit{Unit: Second, RequestsPerUnit: u32(16)}}}},
		},
		{
			name: "nulls are absent",
			yaml: "domain: d\ndescriptors:\n  - key: k\n    value: ~\n    rate_limit:\n    descriptors:\n",
			want: &File{Domain: "d", Descriptors: []Descriptor{{Key: "k"}}},
		},
		{
			name: "no descriptors",
			yaml: "domain: d\n",
			want: &File{Domain: "d"},
		},
		{
			name: "anchors, aliases and merge keys",
			yaml: `domain: d
descriptors:
  - key: a
    rate_limit: &base {unit: second, requests_per_unit: 5, burst: 9}
  - key: b
    rate_limit: *base
  - key: c
    rate_limit:
      <<: *base
      burst: 20
      name: c
`,
			want: &File{Domain: "d", Descriptors: []Descriptor{
				{Key: "a", RateLimit: &RateLimit{Unit: Second, RequestsPerUnit: u32(5), Burst: u32(9)}},
				{Key: "b", RateLimit: &RateLimit{Unit: Second, RequestsPerUnit: u32(5), Burst: u32(9)}},
				{Key: "c", RateLimit: &RateLimit{Unit: Second, RequestsPerUnit: u32(5), Burst: u32(20), Name: "c"}},
			}},
		},
		{
			name: "every field",
			yaml: `domain: d
descriptors:
  - key: files
    value: /f/*
    shadow_mode: true
    detailed_metric: true
    value_to_metric: true
    share_threshold: true
    rate_limit:
      name: n
      replaces: [{name: m}]
      unit: week
      unit_multiplier: 2
      requests_per_unit: 7
      burst: 3
      local: {unit: month, unit_multiplier: 1, requests_per_unit: 4, burst: 2}
  - key: other
    rate_limit: {name: m, unit: year, requests_per_unit: 4294967295}
`,
			want: &File{Domain: "d", Descriptors: []Descriptor{
				{Key: "files", Value: "/f/*", ShadowMode: true, DetailedMetric: true, ValueToMetric: true, ShareThreshold: true,
					RateLimit: &RateLimit{Name: "n", Replaces: []Replace{{Name: "m"}}, Unit: Week, UnitMultiplier: 2,
						RequestsPerUnit: u32(7), Burst: u32(3),
						Local: &LocalLimit{Unit: Month, UnitMultiplier: 1, RequestsPerUnit: u32(4), Burst: u32(2)}}},
				{Key: "other", RateLimit: &RateLimit{Name: "m", Unit: Year, RequestsPerUnit: u32(4294967295)}},
			}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Parse("f.yaml", []byte(tt.yaml))
			if err != nil {
				t.Fatalf("Parse() error = %v", err)
			}
			tt.want.Name = "f.yaml"
			if diff := cmp.Diff(tt.want, got, ignorePositions); diff != "" {
				t.Errorf("Parse() mismatch (-want +got):\n%s", diff)
			}
			if _, err := New([]*File{got}, Options{}); err != nil {
				t.Errorf("New() error = %v", err)
			}
		})
	}
}

// TestRoundTrip checks that yaml.Marshal of a parsed File parses back equal.
func TestRoundTrip(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("testdata/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range files {
		t.Run(filepath.Base(p), func(t *testing.T) {
			t.Parallel()
			data, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			f, err := Parse(p, data)
			if err != nil {
				t.Fatalf("Parse(%s) error = %v", p, err)
			}
			checkRoundTrip(t, f)
		})
	}
}

func checkRoundTrip(t *testing.T, f *File) {
	t.Helper()
	out, err := yaml.Marshal(f)
	if err != nil {
		t.Fatalf("yaml.Marshal(%s) error = %v", f.Name, err)
	}
	g, err := Parse(f.Name, out)
	if err != nil {
		t.Fatalf("Parse(Marshal(%s)) error = %v\n%s", f.Name, err, out)
	}
	if diff := cmp.Diff(f, g, ignorePositions); diff != "" {
		t.Errorf("Parse(Marshal(%s)) mismatch (-first +second):\n%s\n%s", f.Name, diff, out)
	}
}

func TestParseAliasBomb(t *testing.T) {
	t.Parallel()
	// Ten levels of ten aliases each: 10^10 descriptors if expanded.
	var b []byte
	b = append(b, "domain: d\ndescriptors:\n  - &l0 {key: k0}\n"...)
	for i := 1; i <= 10; i++ {
		b = fmt.Appendf(b, "  - &l%d {key: k%d, descriptors: [", i, i)
		for j := range 10 {
			if j > 0 {
				b = append(b, ", "...)
			}
			b = fmt.Appendf(b, "*l%d", i-1)
		}
		b = append(b, "]}\n"...)
	}
	_, err := Parse("bomb.yaml", b)
	if err == nil || !strings.Contains(err.Error(), "too many aliases") {
		t.Fatalf("Parse(bomb) error = %v, want too many aliases", err)
	}
	if n := strings.Count(err.Error(), "\n") + 1; n > maxErrors+1 {
		t.Errorf("Parse(bomb) reported %d problems, want at most %d", n, maxErrors+1)
	}
	var deep []byte
	deep = append(deep, "domain: d\ndescriptors:\n"...)
	indent := ""
	for range maxDepth + 1 {
		deep = append(deep, indent+"- key: k\n"+indent+"  descriptors:\n"...)
		indent += "    "
	}
	_, err = Parse("deep.yaml", deep)
	if err == nil {
		t.Fatalf("Parse(%d levels) = nil error, want too deep", maxDepth+1)
	}
}
