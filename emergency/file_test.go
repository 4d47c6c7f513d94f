package emergency_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rls/sluice/emergency"
	"github.com/sluice-rls/sluice/internal/logtest"
)

// writeAtomic replaces path's content by a rename, as editors and
// configuration tools do.
func writeAtomic(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// digestsOf is a digests file accepting secrets.
func digestsOf(secrets ...string) string {
	var b strings.Builder
	b.WriteString("# accepted emergency secrets\n")
	for _, s := range secrets {
		b.WriteString(emergency.Digest(s) + "\n")
	}
	return b.String()
}

// eventually polls cond with a deadline: the watcher reacts to the
// kernel's file events, which no test clock can move.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after 5s: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// watch runs f.Watch until the test ends.
func watch(t *testing.T, f *emergency.File) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Watch(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch: %v", err)
		}
	})
}

func TestOpenRefusesABadFile(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("s3cret-in-plain\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{filepath.Join(dir, "missing"), bad} {
		f, err := emergency.Open(path, emergency.Options{})
		if err == nil {
			t.Errorf("Open(%s) = %v, want an error", path, f)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("Open(%s) error %q repeats the file's content", path, err)
		}
	}
}

// TestFileRotation rotates the secret with the watcher running: an
// overlap where both work, then the old one removed, then a bad file that
// keeps the last good digests and is counted. No line logged holds a
// secret or a digest.
func TestFileRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "digests")
	writeAtomic(t, path, digestsOf("old-secret"))
	var logs logtest.Buffer
	reg := prometheus.NewRegistry()
	f, err := emergency.Open(path, emergency.Options{
		Logger:     slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !f.Match("old-secret") || f.Match("new-secret") {
		t.Fatalf("after Open: old %v new %v, want true false", f.Match("old-secret"), f.Match("new-secret"))
	}
	watch(t, f)

	writeAtomic(t, path, digestsOf("old-secret", "new-secret"))
	eventually(t, "the new secret is accepted", func() bool { return f.Match("new-secret") })
	if !f.Match("old-secret") {
		t.Error("overlap: the old secret stopped working before it was removed")
	}
	writeAtomic(t, path, digestsOf("new-secret"))
	eventually(t, "the old secret is refused", func() bool { return !f.Match("old-secret") })

	errorsBefore := metric(t, reg, "ratelimit_emergency_secret_loads_total", "error")
	if err := os.WriteFile(path, []byte("not a digest\n"), 0o600); err != nil { // in place, not renamed
		t.Fatal(err)
	}
	eventually(t, "the bad file is counted", func() bool { return metric(t, reg, "ratelimit_emergency_secret_loads_total", "error") > errorsBefore })
	if !f.Match("new-secret") || f.Len() != 1 {
		t.Errorf("after a bad file: new secret %v, %d digests; want the last good file's (true, 1)", f.Match("new-secret"), f.Len())
	}
	if got := metric(t, reg, "ratelimit_emergency_secrets", ""); got != 1 {
		t.Errorf("ratelimit_emergency_secrets = %v, want 1", got)
	}
	out := logs.String()
	if !strings.Contains(out, "emergency secrets file rejected") {
		t.Errorf("the rejected file was not logged:\n%s", out)
	}
	for _, secret := range []string{"old-secret", "new-secret"} {
		for _, leak := range []string{secret, emergency.Digest(secret), emergency.Digest(secret)[:16]} {
			if strings.Contains(out, leak) {
				t.Errorf("a log line holds %q:\n%s", leak, out)
			}
		}
	}
}

// TestFileKubernetesSecretSwap: a Secret volume holds its files in a
// timestamped directory behind the symlink ..data, and the file's name is
// a symlink through ..data; an update swaps ..data atomically, writing no
// file under the watched name. The watcher sees it.
func TestFileKubernetesSecretSwap(t *testing.T) {
	mount := t.TempDir()
	version := func(name, content string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(mount, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(mount, name, "digests"), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(name, filepath.Join(mount, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(mount, "..data_tmp"), filepath.Join(mount, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..2026_12_02_01_00_00.1", digestsOf("first"))
	if err := os.Symlink("..data/digests", filepath.Join(mount, "digests")); err != nil {
		t.Fatal(err)
	}
	f, err := emergency.Open(filepath.Join(mount, "digests"), emergency.Options{})
	if err != nil {
		t.Fatal(err)
	}
	watch(t, f)
	version("..2026_12_02_01_05_00.2", digestsOf("second"))
	eventually(t, "the swapped Secret's secret is accepted", func() bool { return f.Match("second") })
	if f.Match("first") {
		t.Error("the replaced Secret's secret is still accepted")
	}
}

// metric reads a counter or gauge gathered from reg: the series of name
// whose result label is result ("" for a metric without labels); 0 when
// there is none.
func metric(t *testing.T, reg *prometheus.Registry, name, result string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if result != "" && (len(m.GetLabel()) != 1 || m.GetLabel()[0].GetValue() != result) {
				continue
			}
			return m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return 0
}
