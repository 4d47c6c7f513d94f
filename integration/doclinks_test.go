package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// This file carries no build tag: `go test ./integration` checks the docs'
// links without building or starting anything.

// mdLink matches an inline Markdown link or image: [text](target) or
// [text](target "title"). Text may hold one level of brackets.
var mdLink = regexp.MustCompile(`\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(([^()\s]+)(?:\s+"[^"]*")?\)`)

// TestDocLinks checks every relative link of README.md and docs/ (its
// subdirectories included): the file or directory it names exists, and
// an anchor into a Markdown file names one of its headings.
func TestDocLinks(t *testing.T) {
	t.Parallel()
	files := []string{"../README.md"}
	err := filepath.WalkDir("../docs", func(path string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(path, ".md") {
			files = append(files, path)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]map[string]bool{} // cleaned path → heading anchors
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		a := headingAnchors(string(b))
		anchors[path] = a
		return a
	}
	checked := 0
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range proseLines(string(b)) {
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				path, anchor, _ := strings.Cut(target, "#")
				dest := filepath.Clean(file)
				if path != "" {
					dest = filepath.Join(filepath.Dir(file), path)
					if _, err := os.Stat(dest); err != nil {
						t.Errorf("%s:%d: link %q: %v", file, n+1, target, err)
						continue
					}
				}
				checked++
				if anchor == "" || !strings.HasSuffix(dest, ".md") {
					continue
				}
				if !anchorsOf(dest)[anchor] {
					t.Errorf("%s:%d: link %q: %s has no heading with anchor #%s", file, n+1, target, dest, anchor)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("no links checked: the docs were not found")
	}
}

// runbookURL is an alert's runbook link in a Prometheus rule file.
var runbookURL = regexp.MustCompile(`(?m)^\s*runbook_url:\s*(\S+)\s*$`)

// TestRunbookLinks checks the runbook_url of every alert of
// envoy-examples/prometheus-rules.yaml: a heading of docs/operations.md on
// the repository's main branch, which exists.
func TestRunbookLinks(t *testing.T) {
	const base = "https://github.com/sluice-rls/sluice/blob/main/docs/operations.md#"
	rules, err := os.ReadFile("../envoy-examples/prometheus-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ops, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := headingAnchors(string(ops))
	alerts := regexp.MustCompile(`(?m)^\s*- alert:`).FindAll(rules, -1)
	links := runbookURL.FindAllSubmatch(rules, -1)
	if len(links) != len(alerts) {
		t.Errorf("%d alerts, %d runbook_url annotations: one each", len(alerts), len(links))
	}
	for _, m := range links {
		anchor, ok := strings.CutPrefix(string(m[1]), base)
		if !ok || !anchors[anchor] {
			t.Errorf("runbook_url %s: want %s<anchor of a heading of docs/operations.md>", m[1], base)
		}
	}
}

// proseLines returns the lines of a Markdown text with fenced code blocks
// and inline code blanked, so that code that looks like a link is not read
// as one. Line numbers are kept.
func proseLines(md string) []string {
	lines := strings.Split(md, "\n")
	fenced := false
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			lines[i] = ""
			continue
		}
		if fenced {
			lines[i] = ""
			continue
		}
		lines[i] = inlineCode.ReplaceAllString(l, "``")
	}
	return lines
}

var inlineCode = regexp.MustCompile("`[^`]*`")

// headingAnchors returns the anchors GitHub gives the headings of a
// Markdown text: lower case, punctuation dropped, spaces as hyphens, and
// -1, -2, … after repeats.
func headingAnchors(md string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, l := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(l, "#") {
			continue
		}
		text := strings.TrimSpace(strings.TrimLeft(l, "#"))
		a := slug(text)
		if k := seen[a]; k > 0 {
			out[a+"-"+strconv.Itoa(k)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// slug is GitHub's heading anchor of text.
func slug(text string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// TestSlug pins slug on headings of the docs' own kinds.
func TestSlug(t *testing.T) {
	t.Parallel()
	for text, want := range map[string]string{
		"Packages and their arrows":                                                             "packages-and-their-arrows",
		"Lease sizing (leased buckets): a counting simulation":                                  "lease-sizing-leased-buckets-a-counting-simulation",
		"Tracing (`service` BenchmarkTracing, BenchmarkTracingCost; `tracing` BenchmarkExport)": "tracing-service-benchmarktracing-benchmarktracingcost-tracing-benchmarkexport",
		"Drop-in pass: be2996e → main":                                                          "drop-in-pass-be2996e--main",
	} {
		if got := slug(text); got != want {
			t.Errorf("slug(%q) = %q, want %q", text, got, want)
		}
	}
}
