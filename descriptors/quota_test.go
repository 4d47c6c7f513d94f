package descriptors

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// quotaFile uses envoyproxy/ratelimit's quota_mode and metadata the way its
// README's quota example does: a soft per-tenant quota next to a hard limit.
const quotaFile = `domain: ai
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: backend_name
        quota_mode: true
        metadata:
          backend: provisioned
          weight: 2
          ratio: 0.5
          on: true
          none: null
          pools: [a, 1]
          nested: {region: us-east-1}
        rate_limit: {unit: minute, requests_per_unit: 10}
`

func TestParseQuotaModeAndMetadata(t *testing.T) {
	t.Parallel()
	f, err := Parse("quota.yaml", []byte(quotaFile))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	checkRoundTrip(t, f)
	cfg, err := New([]*File{f}, Options{})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	r := cfg.Domain("ai").Match([]Entry{{Key: "tenant", Value: "t"}, {Key: "backend_name", Value: "b"}})
	if r == nil || !r.QuotaMode {
		t.Fatalf("matched rule %v: want the quota_mode rule", r)
	}
	want := map[string]any{
		"backend": "provisioned", "weight": int64(2), "ratio": 0.5, "on": true, "none": nil,
		"pools": []any{"a", int64(1)}, "nested": map[string]any{"region": "us-east-1"},
	}
	if diff := cmp.Diff(want, r.Metadata); diff != "" {
		t.Errorf("Metadata mismatch (-want +got):\n%s", diff)
	}
	if !strings.Contains(r.String(), "quota_mode") {
		t.Errorf("String() = %q, want quota_mode named", r.String())
	}
	parent := cfg.Domain("ai").Match([]Entry{{Key: "tenant", Value: "t"}})
	if parent == nil || parent.QuotaMode || parent.Metadata != nil {
		t.Errorf("parent rule %v: want no quota_mode, no metadata", parent)
	}
}

func TestParseQuotaModeAndMetadataErrors(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"quota_mode: maybe", `e.yaml:4:17: quota_mode must be true or false, got "maybe"`},
		{"metadata: [a]", "e.yaml:4:15: metadata must be a mapping, got a list"},
		{"metadata: text", `e.yaml:4:15: metadata must be a mapping, got "text"`},
		{"metadata: {[a]: 1}", "e.yaml:4:16: metadata keys must be strings, got a list"},
		{"metadata: {a: .nan}", `e.yaml:4:19: metadata numbers must be finite, got ".nan"`},
		{"metadata: {<<: {a: 1}}", "e.yaml:4:16: merge keys (<<) are not supported in metadata"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			_, err := Parse("e.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    "+tt.in+"\n    rate_limit: {unit: second, requests_per_unit: 1}\n"))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Parse(%s) error = %v, want %q", tt.in, err, tt.want)
			}
		})
	}
}

// TestParsePostpaid reads postpaid, and quota_mode implying it.
func TestParsePostpaid(t *testing.T) {
	t.Parallel()
	const file = `domain: ai
descriptors:
  - key: tenant
    postpaid: true
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: service
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 2}
`
	f, err := Parse("postpaid.yaml", []byte(file))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	checkRoundTrip(t, f)
	cfg, err := New([]*File{f}, Options{})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	for _, tt := range []struct {
		key           string
		postpaid      bool
		quota         bool
		wantInString  string
		wantOutString string
	}{
		{"tenant", true, false, ", postpaid", "quota_mode"},
		{"service", true, true, ", quota_mode", "postpaid"},
		{"plain", false, false, "", "postpaid"},
	} {
		r := cfg.Domain("ai").Match([]Entry{{Key: tt.key, Value: "v"}})
		if r == nil || r.Postpaid != tt.postpaid || r.QuotaMode != tt.quota {
			t.Errorf("%s: rule %v, want postpaid %v, quota_mode %v", tt.key, r, tt.postpaid, tt.quota)
			continue
		}
		if s := r.String(); !strings.Contains(s, tt.wantInString) || strings.Contains(s, tt.wantOutString) {
			t.Errorf("%s: String() = %q, want %q in it and not %q", tt.key, s, tt.wantInString, tt.wantOutString)
		}
	}
	if _, err := Parse("bad.yaml", []byte("domain: ai\ndescriptors:\n  - key: k\n    postpaid: maybe\n")); err == nil {
		t.Errorf("postpaid: maybe parsed, want an error")
	}
}
