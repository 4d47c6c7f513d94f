package descriptors

import (
	"strings"
	"testing"
)

func TestParseProtected(t *testing.T) {
	t.Parallel()
	f, err := Parse("p.yaml", []byte(`domain: d
descriptors:
  - key: login
    protected: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: user
    rate_limit: {unit: second, requests_per_unit: 5}
`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	checkRoundTrip(t, f)
	cfg, err := New([]*File{f}, Options{})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	r := cfg.Domain("d").Match([]Entry{{Key: "login", Value: "x"}})
	if r == nil || !r.Protected || !strings.Contains(r.String(), ", protected") {
		t.Errorf("login rule %v: want Protected, and String naming it", r)
	}
	if u := cfg.Domain("d").Match([]Entry{{Key: "user", Value: "x"}}); u == nil || u.Protected {
		t.Errorf("user rule %v: want not protected", u)
	}
	if _, err := Parse("e.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    protected: yes please\n")); err == nil ||
		!strings.Contains(err.Error(), `e.yaml:4:16: protected must be true or false`) {
		t.Errorf("Parse(protected: yes please) error = %v, want a position and the reason", err)
	}
}
