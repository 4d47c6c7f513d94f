package ruleset_test

import (
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/internal/logtest"
	"github.com/sluice-rls/sluice/ruleset"
)

func rulesYAML(n int) string {
	return "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: " + strconv.Itoa(n) + "}\n"
}

func limitOf(t *testing.T, s *ruleset.Store) uint64 {
	t.Helper()
	r := s.Rules().Domain("d").Match([]descriptors.Entry{{Key: "k", Value: "v"}})
	if r == nil || r.Global == nil {
		t.Fatalf("rule k not loaded")
	}
	return r.Global.Requests
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type fixture struct {
	store *ruleset.Store
	r     *ruleset.Reloader
	log   *logtest.Buffer
	reg   *prometheus.Registry
}

func newFixture(t *testing.T, path string) *fixture {
	t.Helper()
	cfg, err := ruleset.Load(path, descriptors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{store: ruleset.NewStore(cfg), log: &logtest.Buffer{}, reg: prometheus.NewRegistry()}
	f.r = &ruleset.Reloader{
		Path:    path,
		Store:   f.store,
		Log:     slog.New(slog.NewTextHandler(f.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics: ruleset.NewReloadMetrics(f.reg),
	}
	return f
}

func (f *fixture) loads(t *testing.T, result string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() == "ratelimit_config_loads_total" && m.GetLabel()[0].GetValue() == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1
}

// gauge reads an unlabelled gauge; -1 when it does not exist.
func (f *fixture) gauge(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

func TestReloadKeepsRulesOnError(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	os.WriteFile(file, []byte(rulesYAML(10)), 0o644)
	f := newFixture(t, dir)

	os.WriteFile(file, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n"), 0o644)
	err := f.r.Reload()
	if err == nil || !strings.Contains(err.Error(), "rules.yaml:4:") {
		t.Fatalf("Reload of a bad file: %v, want an error naming rules.yaml:4", err)
	}
	if got := limitOf(t, f.store); got != 10 {
		t.Errorf("after a failed reload the limit is %d, want the running 10", got)
	}
	if got := f.loads(t, "error"); got != 1 {
		t.Errorf("error loads = %v, want 1", got)
	}
	if !strings.Contains(f.log.String(), "keeping the running rules") {
		t.Errorf("log lacks the failure line:\n%s", f.log)
	}
	if got := f.gauge(t, "ratelimit_config_last_load_successful"); got != 0 {
		t.Errorf("ratelimit_config_last_load_successful = %v after a failed reload, want 0 (until a load succeeds)", got)
	}

	os.WriteFile(file, []byte(rulesYAML(20)), 0o644)
	if err := f.r.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := limitOf(t, f.store); got != 20 {
		t.Errorf("after a good reload the limit is %d, want 20", got)
	}
	if got := f.loads(t, "success"); got != 1 {
		t.Errorf("success loads = %v, want 1", got)
	}
	if got := f.gauge(t, "ratelimit_config_last_load_successful"); got != 1 {
		t.Errorf("ratelimit_config_last_load_successful = %v after a good reload, want 1", got)
	}
	if log := f.log.String(); !strings.Contains(log, "rule changed") || !strings.Contains(log, "global.requests_per_unit: 10 → 20") {
		t.Errorf("log lacks the old → new line:\n%s", log)
	}
}

// TestWatchConfigMapSymlinkSwap reproduces how the kubelet updates a
// ConfigMap volume: files are links into ..data, itself a link to a
// timestamped directory; an update writes a new directory and renames a new
// ..data link over the old one.
func TestWatchConfigMapSymlinkSwap(t *testing.T) {
	dir := t.TempDir()
	writeVersion := func(name string, limit int) {
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "rules.yaml"), []byte(rulesYAML(limit)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	writeVersion("..2026_11_29_00_00_00.1", 10)
	must(t, os.Symlink("..2026_11_29_00_00_00.1", filepath.Join(dir, "..data")))
	must(t, os.Symlink("..data/rules.yaml", filepath.Join(dir, "rules.yaml")))

	f := newFixture(t, dir)
	if got := limitOf(t, f.store); got != 10 {
		t.Fatalf("initial limit %d, want 10", got)
	}
	c := startWatch(t, f)
	// A file that is not a rule file next to the rules is no change. Its
	// event comes before the swap's, so by the reload it has been seen.
	must(t, os.WriteFile(filepath.Join(dir, "sluice.log"), []byte("noise"), 0o644))

	writeVersion("..2026_11_29_00_01_00.2", 30)
	must(t, os.Symlink("..2026_11_29_00_01_00.2", filepath.Join(dir, "..data_tmp")))
	must(t, os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	must(t, os.RemoveAll(filepath.Join(dir, "..2026_11_29_00_00_00.1")))

	c.settle(t, "the symlink swap to reload", func() bool { return limitOf(t, f.store) == 30 }, nil)
	if got := f.loads(t, "success"); got != 1 {
		t.Errorf("%v successful loads for one ConfigMap update, want 1", got)
	}
	for _, line := range strings.Split(f.log.String(), "\n") {
		if strings.Contains(line, "rule files changed") && strings.Contains(line, "sluice.log") {
			t.Errorf("sluice.log was taken for a rule file change:\n%s", f.log)
		}
	}
	// It is not read, and each load says so (envoyproxy/ratelimit would read it).
	if !strings.Contains(f.log.String(), `msg="rule file warning" at=`+filepath.Join(dir, "sluice.log")+` reason="not named *.yaml or *.yml, so not read`) {
		t.Errorf("the load does not warn that sluice.log is not read:\n%s", f.log)
	}
	if got, want := f.gauge(t, "ratelimit_config_last_success_timestamp_seconds"), float64(c.Now().UnixNano())/1e9; got != want {
		t.Errorf("last success at %v, want the reloader's clock, %v", got, want)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestReloadLogsWarnings: a reload of a file envoyproxy/ratelimit loads
// but sluice finds suspect applies it and logs each warning with its
// position.
func TestReloadLogsWarnings(t *testing.T) {
	file := filepath.Join(t.TempDir(), "rules.yaml")
	must(t, os.WriteFile(file, []byte(rulesYAML(10)), 0o644))
	f := newFixture(t, file)
	must(t, os.WriteFile(file, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n"), 0o644))
	if err := f.r.Reload(); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if got := limitOf(t, f.store); got != 0 {
		t.Errorf("limit after reload = %d, want 0 (a unit without requests_per_unit)", got)
	}
	want := `level=WARN msg="rule file warning" at=` + file + `:5:13 reason="rate_limit has a unit but no requests_per_unit`
	if !strings.Contains(f.log.String(), want) {
		t.Errorf("log =\n%s\nwant a line containing\n%s", f.log, want)
	}
}
