package main

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
)

// TestMakeBuildStampsVersion builds rls with the Makefile's build target
// and runs `rls version`: the -X paths of LDFLAGS must name the variables
// of version.go, or the binary reports "devel".
func TestMakeBuildStampsVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	bin := filepath.Join(t.TempDir(), "rls")
	build := exec.Command("make", "-C", "../..", "build", "VERSION=v9.8.7-test", "COMMIT=0123abcd", "BIN="+bin)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatalf("rls version: %v", err)
	}
	want := "rls v9.8.7-test (commit 0123abcd, " + runtime.Version() + ")\n"
	if string(out) != want {
		t.Errorf("rls version printed %q, want %q", out, want)
	}
}

func TestRunVersion(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"version"}, &out, &out, noEnv); err != nil {
		t.Fatal(err)
	}
	b := currentBuild()
	if got, want := out.String(), b.String()+"\n"; got != want {
		t.Errorf("rls version printed %q, want %q", got, want)
	}
	for _, part := range []string{"commit " + b.Commit, runtime.Version()} {
		if !strings.Contains(out.String(), part) {
			t.Errorf("rls version printed %q, lacks %q", out.String(), part)
		}
	}
}

// TestBuildFallbacks: without -X stamps (go run, go build, go install) the
// version and commit come from what the go command recorded.
func TestBuildFallbacks(t *testing.T) {
	if buildVersion != "" || buildCommit != "" {
		t.Skip("test binary stamped with -X")
	}
	rev := "89abcdef0123456789abcdef0123456789abcdef"
	vcs := &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}}}
	tagged := &debug.BuildInfo{Main: debug.Module{Version: "v1.4.0"}}
	tests := []struct {
		name          string
		info          *debug.BuildInfo
		version, comm string
	}{
		{"no build info", nil, "devel", "unknown"},
		{"go build in a checkout", vcs, "devel-89abcdef0123", rev},
		{"go install module@v1.4.0", tagged, "v1.4.0", "unknown"},
	}
	for _, tt := range tests {
		if got := versionOf(tt.info); got != tt.version {
			t.Errorf("%s: version %q, want %q", tt.name, got, tt.version)
		}
		if got := commitOf(tt.info); got != tt.comm {
			t.Errorf("%s: commit %q, want %q", tt.name, got, tt.comm)
		}
	}
}

// TestRunVersionJSON: rls version --json prints one JSON object (on main
// --json was ignored).
func TestRunVersionJSON(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"version", "--json"}, &out, &out, noEnv); err != nil {
		t.Fatal(err)
	}
	var got map[string]string
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("rls version --json printed %q: %v", out.String(), err)
	}
	b := currentBuild()
	if want := map[string]string{"version": b.Version, "commit": b.Commit, "go_version": b.GoVersion}; !maps.Equal(got, want) {
		t.Errorf("rls version --json = %v, want %v", got, want)
	}
}
