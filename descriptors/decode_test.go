package descriptors

import (
	"strings"
	"testing"
)

// TestDecodeScalars covers YAML spellings of numbers and booleans.
func TestDecodeScalars(t *testing.T) {
	t.Parallel()
	numbers := []struct {
		in   string
		want uint32
		err  string
	}{
		{in: "0", want: 0},
		{in: "+5", want: 5},
		{in: "0x10", want: 16},
		{in: "0o17", want: 15},
		{in: "1_000", want: 1000},
		{in: "4294967295", want: 4294967295},
		{in: "4294967296", err: "is too large"},
		{in: "-0x1", err: "must not be negative"},
		{in: "1e3", err: "must be a whole number"},
		{in: `"10"`, err: "must be a whole number"},
		{in: "[1]", err: "must be a whole number, got a list"},
		{in: "{a: 1}", err: "must be a whole number, got a mapping"},
	}
	for _, tt := range numbers {
		t.Run("requests_per_unit "+tt.in, func(t *testing.T) {
			f, err := Parse("n.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: "+tt.in+"\n"))
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), "n.yaml:6:26: requests_per_unit "+tt.err) {
					t.Fatalf("Parse(%s) error = %v, want %q at 6:26", tt.in, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%s) error = %v", tt.in, err)
			}
			if got := *f.Descriptors[0].RateLimit.RequestsPerUnit; got != tt.want {
				t.Errorf("Parse(%s) requests_per_unit = %d, want %d", tt.in, got, tt.want)
			}
		})
	}
	bools := []struct {
		in   string
		want bool
		ok   bool
	}{
		{"true", true, true}, {"false", false, true}, {"True", true, true},
		{"yes", true, true}, {"off", false, true}, // YAML 1.1 spellings, as yaml.v2 read them
		{"1", false, false}, {"maybe", false, false}, {"[true]", false, false},
	}
	for _, tt := range bools {
		t.Run("shadow_mode "+tt.in, func(t *testing.T) {
			f, err := Parse("b.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    shadow_mode: "+tt.in+"\n"))
			if !tt.ok {
				if err == nil || !strings.Contains(err.Error(), "b.yaml:4:18: shadow_mode must be true or false") {
					t.Fatalf("Parse(%s) error = %v, want not a boolean", tt.in, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse(%s) error = %v", tt.in, err)
			}
			if got := f.Descriptors[0].ShadowMode; got != tt.want {
				t.Errorf("Parse(%s) shadow_mode = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

func TestDecodeMergeKeyErrors(t *testing.T) {
	t.Parallel()
	_, err := Parse("m.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      <<: [1]\n      unit: second\n      requests_per_unit: 1\n"))
	if err == nil || !strings.Contains(err.Error(), "m.yaml:5:12: merge key in rate_limit must refer to a mapping") {
		t.Errorf("Parse(merge of a scalar) error = %v, want merge key error at 5:12", err)
	}
	_, err = Parse("m.yaml", []byte("domain: d\nbase: &b {unit: second}\ndescriptors: []\n"))
	if err == nil || !strings.Contains(err.Error(), `m.yaml:2:1: unknown field "base"`) {
		t.Errorf("Parse(anchor holder field) error = %v, want unknown field", err)
	}
	_, err = Parse("m.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: &a {<<: *a}\n"))
	if err == nil || !strings.Contains(err.Error(), "merge keys nested more than 16 deep") {
		t.Errorf("Parse(self-merge) error = %v, want merge depth error", err)
	}
}
