package adaptive

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestProblemsHaveLines: every problem of a file is reported at once, each
// at the line of the value at fault (or of the policy lacking it); a
// decoding error at the line yaml.v3 names; Load names the file.
func TestProblemsHaveLines(t *testing.T) {
	const file = `prometheus: http://prometheus:9090
lock_ttl: 1ms
policies:
  - name: ok
    domain: edge
    proportional: {query: up, baseline: 4}
  - name: bad
    domain: edge
    rule: edge.user_id
    min_scale: 2
    signals:
      - name: p99
        query: p99
        lower_above: 1
        raise_below: 3
  - name: empty
    domain: api
`
	path := filepath.Join(t.TempDir(), "adaptive.yaml")
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	var ps *Problems
	if !errors.As(err, &ps) {
		t.Fatalf("Load = %v, want *Problems", err)
	}
	var lines []int
	for _, p := range ps.List {
		lines = append(lines, p.Line)
	}
	// lock_ttl, min_scale, the signal's raise_below, the policy without signals.
	if want := []int{2, 15, 10, 16}; !slices.Equal(slices.Sorted(slices.Values(lines)), slices.Sorted(slices.Values(want))) {
		t.Errorf("problems at lines %v, want %v:\n%v", lines, want, err)
	}
	if ps.Path != path || !containsLine(err.Error(), path+":10: policy \"bad\": min_scale must be above 0 and at most 1, not 2") {
		t.Errorf("message:\n%v\nwant lines PATH:LINE: reason", err)
	}
	for _, tc := range []struct {
		yaml string
		line int
	}{
		{"prometheus: http://p\npolicies:\n  - name: a\n    domian: d\n", 4},
		{"prometheus: http://p\npolicies: [\n", 2},
		{"prometheus: http://p\nlock_ttl: soon\n", 2},
	} {
		_, err := Parse([]byte(tc.yaml))
		if !errors.As(err, &ps) || len(ps.List) != 1 || ps.List[0].Line != tc.line {
			t.Errorf("Parse(%q) = %v, want one problem at line %d", tc.yaml, err, tc.line)
		}
	}
}

func containsLine(s, line string) bool {
	for l := range strings.SplitSeq(s, "\n") {
		if l == line {
			return true
		}
	}
	return false
}
