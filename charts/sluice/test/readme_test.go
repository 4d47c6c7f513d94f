package charttest

import (
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// valuePaths adds the dotted paths of v's keys to all, nested ones included
// (free-form maps such as resources have theirs too), and those of the keys
// that hold no map, or an empty one, to leaves.
func valuePaths(prefix string, v any, all, leaves map[string]bool) {
	for k, sub := range v.(map[string]any) {
		p := k
		if prefix != "" {
			p = prefix + "." + k
		}
		all[p] = true
		if m, ok := sub.(map[string]any); ok && len(m) > 0 {
			valuePaths(p, sub, all, leaves)
		} else {
			leaves[p] = true
		}
	}
}

var tableKey = regexp.MustCompile("`([A-Za-z][A-Za-z0-9.]*)`")

// readmeValues returns the keys the README's Values table documents: the
// backquoted names of each row's first cell.
func readmeValues(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Values\n")
	if !ok {
		t.Fatal("README.md has no ## Values section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	out := map[string]bool{}
	for line := range strings.SplitSeq(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		for _, m := range tableKey.FindAllStringSubmatch(cells[1], -1) {
			out[m[1]] = true
		}
	}
	return out
}

// TestReadmeDocumentsEveryValue: each key of values.yaml is in the README's
// table, itself or through a documented parent (probes.readiness covers
// probes.readiness.periodSeconds); each key the table names exists. A new
// value without a row, or a row left behind by a removed value, fails.
func TestReadmeDocumentsEveryValue(t *testing.T) {
	b, err := os.ReadFile("../values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(b, &values); err != nil {
		t.Fatal(err)
	}
	paths, leaves := map[string]bool{}, map[string]bool{}
	valuePaths("", values, paths, leaves)
	documented := readmeValues(t)
	if !documented["goMemLimit"] {
		t.Fatalf("the Values table was not read (goMemLimit missing): %v", documented)
	}
	var missing, unknown []string
	for p := range leaves {
		covered := false
		for q := p; q != ""; {
			if documented[q] {
				covered = true
				break
			}
			i := strings.LastIndex(q, ".")
			if i < 0 {
				break
			}
			q = q[:i]
		}
		if !covered {
			missing = append(missing, p)
		}
	}
	for d := range documented {
		if !paths[d] {
			unknown = append(unknown, d)
		}
	}
	sort.Strings(missing)
	sort.Strings(unknown)
	if len(missing) > 0 {
		t.Errorf("values.yaml keys the README's Values table does not document: %v", missing)
	}
	if len(unknown) > 0 {
		t.Errorf("the README's Values table names keys values.yaml lacks: %v", unknown)
	}
}
