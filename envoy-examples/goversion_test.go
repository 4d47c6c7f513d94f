package examples

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// goModVersion returns the go directive of go.mod, a full release such as
// 1.26.8: the one Go version of a build.
func goModVersion(t *testing.T) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+\.\d+)\s*$`).FindStringSubmatch(repoFile(t, "go.mod"))
	if m == nil {
		t.Fatal("go.mod has no go directive naming a full release (go 1.x.y)")
	}
	return m[1]
}

var (
	// goMention is a Go version in prose or output: "Go 1.26.8", "go1.26.8".
	goMention = regexp.MustCompile(`\b[Gg]o ?(1\.\d+(?:\.\d+)?)\b`)
	// envToolchain is GOTOOLCHAIN in a Dockerfile ENV.
	envToolchain = regexp.MustCompile(`(?:^|\s)GOTOOLCHAIN=(\S+)`)
	// setupGoVersion is a literal Go version given to actions/setup-go.
	setupGoVersion = regexp.MustCompile(`(?m)^\s*go-version:`)
)

// TestGoVersionAgrees: go.mod, the Dockerfile's build stage, the README and
// the CI workflows name one Go version. golang images set GOTOOLCHAIN=local:
// a build stage older than go.mod fails at `go mod download`.
func TestGoVersionAgrees(t *testing.T) {
	want := goModVersion(t)
	if m := regexp.MustCompile(`(?m)^toolchain (\S+)`).FindStringSubmatch(repoFile(t, "go.mod")); m != nil && m[1] != "go"+want {
		t.Errorf("go.mod: toolchain %s, go %s: one version, please", m[1], want)
	}

	_, stages := parseDockerfile(t, repoFile(t, "Dockerfile"))
	build := stages[0]
	image := ""
	for _, f := range strings.Fields(build.from) {
		if strings.HasPrefix(f, "golang:") {
			image = digest.ReplaceAllString(f, "")
		}
	}
	if image != "golang:"+want {
		t.Errorf("Dockerfile build stage FROM %s: want golang:%s (go.mod)", build.from, want)
	}
	toolchain := ""
	for _, in := range build.body {
		if m := envToolchain.FindStringSubmatch(in.args); in.keyword == "ENV" && m != nil {
			toolchain = m[1]
		}
	}
	if toolchain != "go"+want {
		t.Errorf("Dockerfile build stage: ENV GOTOOLCHAIN=%q, want go%s (go.mod's, exactly)", toolchain, want)
	}

	readme := repoFile(t, "README.md")
	mentions := goMention.FindAllStringSubmatch(readme, -1)
	if len(mentions) == 0 {
		t.Error("README.md names no Go version")
	}
	for _, m := range mentions {
		if m[1] != want {
			t.Errorf("README.md says %q, go.mod %s", m[0], want)
		}
	}

	workflows, err := filepath.Glob(filepath.Join("..", ".github", "workflows", "*.y*ml"))
	if err != nil || len(workflows) == 0 {
		t.Fatalf("no .github/workflows: %v", err)
	}
	for _, w := range workflows {
		b, err := os.ReadFile(w)
		if err != nil {
			t.Fatal(err)
		}
		if setupGoVersion.Match(b) {
			t.Errorf("%s: go-version: a second Go version; use go-version-file: go.mod", w)
		}
	}
}

// TestImageHoldsRLS: the binary the build stage writes is copied to /rls in
// the final stage, the path ENTRYPOINT runs (TestDockerfile).
func TestImageHoldsRLS(t *testing.T) {
	_, stages := parseDockerfile(t, repoFile(t, "Dockerfile"))
	out := regexp.MustCompile(`go build .*-o (\S+) \./cmd/rls`)
	var built string
	for _, in := range stages[0].body {
		if m := out.FindStringSubmatch(in.args); in.keyword == "RUN" && m != nil {
			built = m[1]
		}
	}
	if built == "" {
		t.Fatal("the build stage builds no ./cmd/rls")
	}
	copied := false
	for _, in := range stages[len(stages)-1].body {
		if in.keyword == "COPY" && strings.Fields(in.args)[0] == "--from=build" && strings.HasSuffix(in.args, " "+built+" /rls") {
			copied = true
		}
	}
	if !copied {
		t.Errorf("the final stage has no COPY --from=build %s /rls", built)
	}
}
