package examples

import (
	"encoding/json"
	"io"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-rls/sluice/cmd/rls/flags"
)

// dockerBuild is the build command the Dockerfile must run.
const dockerBuild = `CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.buildVersion=${VERSION} -X main.buildCommit=${COMMIT}" -o /out/rls ./cmd/rls`

// digest is an image reference's @sha256 pin.
var digest = regexp.MustCompile(`@sha256:[0-9a-f]{64}`)

// dockerfile is the Dockerfile as instructions: keyword and arguments, with
// comments and line continuations resolved.
// instruction is one Dockerfile instruction: keyword and arguments,
// comments dropped and line continuations joined.
type instruction struct{ keyword, args string }

// dockerfile returns the Dockerfile's instructions in order.
func dockerfile(t *testing.T) []instruction {
	t.Helper()
	out, stages := parseDockerfile(t, repoFile(t, "Dockerfile"))
	for _, st := range stages {
		out = append(out, instruction{"FROM", st.from})
		out = append(out, st.body...)
	}
	return out
}

func TestDockerfile(t *testing.T) {
	ins := dockerfile(t)
	var froms, runs []string
	var expose, entrypoint, cmd string
	for _, in := range ins {
		switch in.keyword {
		case "FROM":
			// The digests are checked in cmd/rls/dockerfile_test.go.
			froms = append(froms, digest.ReplaceAllString(in.args, ""))
		case "RUN":
			runs = append(runs, in.args)
		case "EXPOSE":
			expose = in.args
		case "ENTRYPOINT":
			entrypoint = in.args
		case "CMD":
			cmd = in.args
		}
	}

	// Two stages: the Go toolchain of go.mod on the builder's platform
	// (cross-compiling), then distroless as nonroot.
	wantFrom := []string{"--platform=$BUILDPLATFORM golang:" + goModVersion(t) + " AS build", "gcr.io/distroless/static-debian12:nonroot"}
	if !slices.Equal(froms, wantFrom) {
		t.Errorf("FROM %q, want %q", froms, wantFrom)
	}
	if !slices.Contains(runs, dockerBuild) {
		t.Errorf("RUN %q: none is %q", runs, dockerBuild)
	}

	// The image serves on the ports rls serve listens on by default, with
	// no flags.
	st, err := flags.ParseServe(nil, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ports := strings.Fields(expose)
	for _, addr := range []string{st.GRPCAddr, st.HTTPAddr} {
		if p := strconv.Itoa(addrPort(t, addr)); !slices.Contains(ports, p) {
			t.Errorf("EXPOSE %s lacks %s (rls serve listens on %s)", expose, p, addr)
		}
	}
	var ep, c []string
	if err := json.Unmarshal([]byte(entrypoint), &ep); err != nil || !slices.Equal(ep, []string{"/rls"}) {
		t.Errorf(`ENTRYPOINT %s, want ["/rls"] (exec form)`, entrypoint)
	}
	if err := json.Unmarshal([]byte(cmd), &c); err != nil || !slices.Equal(c, []string{"serve"}) {
		t.Errorf(`CMD %s, want ["serve"]`, cmd)
	}
}

// TestDockerBuildMatchesMakefile checks that the image is built like
// `make build`: static, reproducible paths, stripped, the same package.
func TestDockerBuildMatchesMakefile(t *testing.T) {
	makefile := repoFile(t, "Makefile")
	recipe := regexp.MustCompile(`(?m)^build:.*\n((?:\t.*\n)+)`).FindStringSubmatch(makefile)
	if recipe == nil {
		t.Fatal("Makefile has no build target")
	}
	ldflags := regexp.MustCompile(`(?m)^LDFLAGS\s*:?=\s*(.*)$`).FindStringSubmatch(makefile)
	if ldflags == nil {
		t.Fatal("Makefile defines no LDFLAGS")
	}
	for _, flag := range []string{"CGO_ENABLED=0", "-trimpath", "./cmd/rls", "-ldflags"} {
		if !strings.Contains(recipe[1], flag) {
			t.Errorf("Makefile build recipe %q lacks %s", recipe[1], flag)
		}
		if !strings.Contains(dockerBuild, flag) {
			t.Errorf("Dockerfile build %q lacks %s", dockerBuild, flag)
		}
	}
	for _, flag := range []string{"-s", "-w"} {
		if !slices.Contains(strings.Fields(ldflags[1]), flag) {
			t.Errorf("Makefile LDFLAGS %q lacks %s", ldflags[1], flag)
		}
	}
}

// TestDockerignoreKeepsBuildInputs checks that .dockerignore excludes no
// source or embedded file of the rls binary, nor go.mod and go.sum, so the
// image builds from a clean context.
func TestDockerignoreKeepsBuildInputs(t *testing.T) {
	var patterns []string
	for line := range strings.Lines(repoFile(t, ".dockerignore")) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "!") || strings.Contains(line, "**") {
			t.Fatalf(".dockerignore pattern %q: this test only understands plain patterns", line)
		}
		patterns = append(patterns, path.Clean(strings.TrimPrefix(line, "/")))
	}

	cmd := exec.Command("go", "list", "-deps", "-json=Dir,GoFiles,EmbedFiles,Module", "./cmd/rls")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	inputs := []string{"go.mod", "go.sum"}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var pkg struct {
			Dir                 string
			GoFiles, EmbedFiles []string
			Module              *struct{ Main bool }
		}
		if err := dec.Decode(&pkg); err != nil {
			t.Fatal(err)
		}
		if pkg.Module == nil || !pkg.Module.Main {
			continue
		}
		rel, err := filepath.Rel(root, pkg.Dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range append(pkg.GoFiles, pkg.EmbedFiles...) {
			inputs = append(inputs, filepath.ToSlash(filepath.Join(rel, f)))
		}
	}
	if len(inputs) < 4 {
		t.Fatalf("go list found only %q", inputs)
	}
	for _, in := range inputs {
		if p, ok := ignored(patterns, in); ok {
			t.Errorf(".dockerignore pattern %q excludes %s, which the build needs", p, in)
		}
	}
}

// ignored reports the first pattern that excludes file (a slash path
// relative to the context), by Docker's rule: a pattern excludes a path
// that matches it, and everything below a directory that matches it.
func ignored(patterns []string, file string) (string, bool) {
	for _, p := range patterns {
		for f := file; f != "." && f != "/"; f = path.Dir(f) {
			if ok, _ := path.Match(p, f); ok {
				return p, true
			}
		}
	}
	return "", false
}
