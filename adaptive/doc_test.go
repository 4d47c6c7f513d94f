package adaptive

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// yamlBlock is a fenced YAML block of a Markdown page.
var yamlBlock = regexp.MustCompile("(?s)```yaml\n(.*?)```")

// TestDocPoliciesParse parses every YAML block of docs/adaptive.md as an
// adaptive-limits file, and checks every query's PromQL with promtool
// (skipped without it, unless RLS_REQUIRE_PROMTOOL=1): the examples there
// are ready to use.
func TestDocPoliciesParse(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/adaptive.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := yamlBlock.FindAllSubmatch(doc, -1)
	if len(blocks) < 5 {
		t.Fatalf("docs/adaptive.md: %d YAML blocks, want the file's reference and the four designs' policies", len(blocks))
	}
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: doc\n    rules:\n")
	for _, b := range blocks {
		c, err := Parse(b[1])
		if err != nil {
			t.Errorf("docs/adaptive.md policy does not parse: %v\n%s", err, b[1])
			continue
		}
		if len(c.Policies) == 0 {
			t.Errorf("docs/adaptive.md block holds no policy:\n%s", b[1])
		}
		for _, p := range c.Policies {
			var qs []string
			for _, s := range p.Signals {
				qs = append(qs, s.Query)
			}
			if p.Proportional != nil {
				qs = append(qs, p.Proportional.Query)
			}
			for i, q := range qs {
				fmt.Fprintf(&rules, "      - record: doc:%s:%d\n        expr: %s\n", strings.ReplaceAll(p.Name, "-", "_"), i, strconv.Quote(q))
			}
		}
	}
	tool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("RLS_REQUIRE_PROMTOOL") == "1" {
			t.Fatal("promtool not installed; make test installs it (apt-get install prometheus)")
		}
		t.Skip("promtool not installed: the queries' PromQL is not checked")
	}
	path := filepath.Join(t.TempDir(), "doc-rules.yaml")
	if err := os.WriteFile(path, []byte(rules.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(tool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("docs/adaptive.md queries: promtool check rules: %v\n%s", err, out)
	}
}
