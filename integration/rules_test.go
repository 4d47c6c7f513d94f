//go:build integration

package integration

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func minuteRules(domain, n string) string {
	return "domain: " + domain + "\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: " + n + "}\n"
}

// configMapVolume is a directory laid out as the kubelet lays out a
// ConfigMap volume: each key a symlink key -> ..data/key, ..data a symlink
// to a timestamped directory holding the files.
type configMapVolume struct {
	t   *testing.T
	dir string
	n   int
}

// publish writes a new version and swaps ..data to it, as the kubelet does
// (new directory, ..data_tmp link renamed over ..data, old directory
// removed). Links for new keys are created; links of removed keys are left
// to the caller.
func (v *configMapVolume) publish(files map[string]string) {
	v.t.Helper()
	v.n++
	ts := "..2026_12_01_00_00_0" + string(rune('0'+v.n)) + ".1"
	must := func(err error) {
		v.t.Helper()
		if err != nil {
			v.t.Fatal(err)
		}
	}
	must(os.Mkdir(filepath.Join(v.dir, ts), 0o755))
	for name, content := range files {
		writeFile(v.t, filepath.Join(v.dir, ts), name, content)
	}
	old, _ := os.Readlink(filepath.Join(v.dir, "..data"))
	must(os.Symlink(ts, filepath.Join(v.dir, "..data_tmp")))
	must(os.Rename(filepath.Join(v.dir, "..data_tmp"), filepath.Join(v.dir, "..data")))
	for name := range files {
		link := filepath.Join(v.dir, name)
		if _, err := os.Lstat(link); err != nil {
			must(os.Symlink(filepath.Join("..data", name), link))
		}
	}
	if old != "" {
		must(os.RemoveAll(filepath.Join(v.dir, old)))
	}
}

// TestReloadConfigMapSwapThroughTheBinary drives rls serve over a
// ConfigMap-style volume: ..data swaps reload; a key whose link is left
// dangling (the new version lacks it) fails the reload and keeps every
// running rule instead of silently dropping that domain; removing the
// link drops it on purpose; later swaps still reload.
func TestReloadConfigMapSwapThroughTheBinary(t *testing.T) {
	t.Parallel()
	vol := &configMapVolume{t: t, dir: t.TempDir()}
	vol.publish(map[string]string{"a.yaml": minuteRules("a", "2"), "b.yaml": minuteRules("b", "3")})
	p := startRLS(t, "--config", vol.dir)
	limit := func(domain string) uint32 {
		return p.Check(t, domain, "k=x").GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
	}
	if a, b := limit("a"), limit("b"); a != 2 || b != 3 {
		t.Fatalf("initial limits a=%d b=%d, want 2 and 3", a, b)
	}
	waitForLog(t, p, `msg="watching rule files"`)

	vol.publish(map[string]string{"a.yaml": minuteRules("a", "5")}) // b.yaml now dangles
	waitForLog(t, p, "dangling symlink")
	if a, b := limit("a"), limit("b"); a != 2 || b != 3 {
		t.Errorf("after a version with a dangling b.yaml: a=%d b=%d, want the running 2 and 3", a, b)
	}
	if !strings.Contains(p.Log(), "keeping the running rules") {
		t.Errorf("the failed reload is not logged as such:\n%s", p.Log())
	}

	if err := os.Remove(filepath.Join(vol.dir, "b.yaml")); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, "removing the link to reload", func() bool { return limit("a") == 5 })
	if _, body := p.HTTPGet(t, "/rlconfig"); strings.Contains(body, "b.k") {
		t.Errorf("domain b still served after its file was removed:\n%s", body)
	}

	vol.publish(map[string]string{"a.yaml": minuteRules("a", "7")})
	pollUntil(t, "the next ..data swap to reload", func() bool { return limit("a") == 7 })
	if !strings.Contains(p.Log(), `msg="following rule files"`) {
		t.Errorf("the log does not say the watches moved to the new version:\n%s", p.Log())
	}
}

// TestReloadFollowsConfigSymlinkSwapThroughTheBinary: --config is a
// symlink swapped to a new directory; the swap and later edits in the new
// directory reload.
func TestReloadFollowsConfigSymlinkSwapThroughTheBinary(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	for _, v := range []struct{ dir, n string }{{"v1", "2"}, {"v2", "4"}} {
		if err := os.Mkdir(filepath.Join(base, v.dir), 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(base, v.dir), "rules.yaml", minuteRules("r", v.n))
	}
	current := filepath.Join(base, "current")
	if err := os.Symlink("v1", current); err != nil {
		t.Fatal(err)
	}
	p := startRLS(t, "--config", current)
	limit := func() uint32 {
		return p.Check(t, "r", "k=x").GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
	}
	if got := limit(); got != 2 {
		t.Fatalf("initial limit %d, want 2", got)
	}
	waitForLog(t, p, `msg="watching rule files"`)
	if err := os.Symlink("v2", current+".tmp"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(current+".tmp", current); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, "the link swap to reload", func() bool { return limit() == 4 })
	writeFile(t, filepath.Join(base, "v2"), "rules.yaml", minuteRules("r", "6"))
	pollUntil(t, "an edit in the new directory to reload", func() bool { return limit() == 6 })
}

// TestServePeerRuntimeRootThroughTheBinary: --config is
// envoyproxy/ratelimit's runtime root, a symlink to a version holding the
// rules in ratelimit/config/ (a subdirectory), with a file the peer loads
// but sluice finds suspect (a unit without requests_per_unit: limit 0).
// The binary serves it with the peer's meaning, logs the warning with its
// position, and reloads when the root link is swapped (the peer's default
// reload).
func TestServePeerRuntimeRootThroughTheBinary(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	for _, v := range []struct{ dir, rules string }{
		{"data-1", "domain: r\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: minute\n"},
		{"data-2", minuteRules("r", "4")},
	} {
		dir := filepath.Join(base, v.dir, "ratelimit", "config")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		writeFile(t, dir, "rules.yaml", v.rules)
	}
	current := filepath.Join(base, "current")
	if err := os.Symlink("data-1", current); err != nil {
		t.Fatal(err)
	}
	p := startRLS(t, "--config", current)
	if st := p.Check(t, "r", "k=x").GetStatuses()[0]; st.GetCode().String() != "OVER_LIMIT" || st.GetCurrentLimit().GetRequestsPerUnit() != 0 {
		t.Errorf("a unit without requests_per_unit: status %v, want OVER_LIMIT with limit 0 (as envoyproxy/ratelimit)", st)
	}
	waitForLog(t, p, `msg="rule file warning" at=`+filepath.Join(current, "ratelimit", "config", "rules.yaml")+`:5:13`)
	waitForLog(t, p, `msg="watching rule files"`)
	if err := os.Symlink("data-2", current+".tmp"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(current+".tmp", current); err != nil {
		t.Fatal(err)
	}
	pollUntil(t, "the runtime root swap to reload", func() bool {
		return p.Check(t, "r", "k=x").GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() == 4
	})
}

// TestServeRefusesUnreadableRuleFiles: at start, a rule file that cannot be
// read stops rls serve with an error naming the file.
func TestServeRefusesUnreadableRuleFiles(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, want string
		make       func(dir string) string
	}{
		{"dangling symlink", "dangling symlink", func(dir string) string {
			path := filepath.Join(dir, "b.yaml")
			if err := os.Symlink("..data/b.yaml", path); err != nil {
				t.Fatal(err)
			}
			return path
		}},
		{"fifo", "not a regular file", func(dir string) string {
			path := filepath.Join(dir, "pipe.yaml")
			if err := syscall.Mkfifo(path, 0o644); err != nil {
				t.Fatal(err)
			}
			return path
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			writeFile(t, dir, "a.yaml", minuteRules("a", "2"))
			bad := tt.make(dir)
			start := time.Now()
			_, stderr, code := runRLS(t, "serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--config", dir)
			if code == 0 || !strings.Contains(stderr, bad) || !strings.Contains(stderr, tt.want) {
				t.Errorf("rls serve exited %d after %v, stderr:\n%s\nwant non-zero with an error naming %s (%s)", code, time.Since(start), stderr, bad, tt.want)
			}
		})
	}
	t.Run("too large", func(t *testing.T) {
		dir := t.TempDir()
		path := writeFile(t, dir, "a.yaml", minuteRules("a", "2"))
		_, stderr, code := runRLS(t, "serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--config", dir, "--max-rule-bytes", "10")
		if code == 0 || !strings.Contains(stderr, path) || !strings.Contains(stderr, "--max-rule-bytes") {
			t.Errorf("rls serve exited %d, stderr:\n%s\nwant non-zero naming %s and --max-rule-bytes", code, stderr, path)
		}
	})
}
