package main

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
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

func TestRegisterBuildInfo(t *testing.T) {
	reg := prometheus.NewRegistry()
	registerBuildInfo(reg, buildInfo{Version: "v1.2.3", Commit: "0123abcd", GoVersion: "go1.26.8"})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "ratelimit_build_info" || mfs[0].GetType().String() != "GAUGE" || len(mfs[0].GetMetric()) != 1 {
		t.Fatalf("gathered %v, want one ratelimit_build_info gauge", mfs)
	}
	m := mfs[0].GetMetric()[0]
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	want := map[string]string{"version": "v1.2.3", "commit": "0123abcd", "goversion": "go1.26.8"}
	if len(labels) != len(want) {
		t.Errorf("labels %v, want %v", labels, want)
	}
	for k, v := range want {
		if labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, labels[k], v)
		}
	}
	if v := m.GetGauge().GetValue(); v != 1 {
		t.Errorf("ratelimit_build_info = %v, want 1", v)
	}
}
