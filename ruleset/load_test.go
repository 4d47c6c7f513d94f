package ruleset_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/ruleset"
)

// loadWithin runs load and fails the test if it has not returned within a
// generous deadline: reading a FIFO or /dev/zero used to block or grow
// memory without end.
func loadWithin(t *testing.T, load func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- load() }()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("loading the rules did not return within 10s (blocked on a read?)")
		return nil
	}
}

func TestLoadDanglingSymlinkIsAnError(t *testing.T) {
	dir := t.TempDir()
	must(t, os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(rulesYAML(10)), 0o644))
	must(t, os.Symlink("gone/b.yaml", filepath.Join(dir, "b.yaml")))
	_, err := ruleset.Load(dir, descriptors.Options{})
	if err == nil {
		t.Fatal("Load of a directory with a dangling b.yaml link succeeded; its domain would silently vanish")
	}
	if !strings.Contains(err.Error(), filepath.Join(dir, "b.yaml")) || !strings.Contains(err.Error(), "dangling symlink") {
		t.Errorf("err = %v, want it to name b.yaml as a dangling symlink", err)
	}
}

func TestReloadDanglingSymlinkKeepsRules(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "real.yml.d")
	must(t, os.Mkdir(target, 0o755))
	must(t, os.WriteFile(filepath.Join(target, "rules"), []byte(rulesYAML(10)), 0o644))
	must(t, os.Symlink(filepath.Join(target, "rules"), filepath.Join(dir, "rules.yaml")))
	f := newFixture(t, dir)
	must(t, os.Remove(filepath.Join(target, "rules")))

	if err := f.r.Reload(); err == nil {
		t.Fatal("Reload with a dangling rules.yaml succeeded")
	}
	if got := limitOf(t, f.store); got != 10 {
		t.Errorf("limit %d after the failed reload, want the running 10", got)
	}
	if got := f.loads(t, "error"); got != 1 {
		t.Errorf("error loads = %v, want 1", got)
	}
	if !strings.Contains(f.log.String(), "dangling symlink") {
		t.Errorf("log does not say why:\n%s", f.log)
	}
}

func TestLoadRefusesNonRegularFiles(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.yaml")
	must(t, syscall.Mkfifo(fifo, 0o644))
	zero := filepath.Join(dir, "zero.yaml")
	must(t, os.Symlink("/dev/zero", zero))
	for _, tt := range []struct{ path, kind string }{
		{fifo, "named pipe"},
		{zero, "device"},
	} {
		t.Run(filepath.Base(tt.path), func(t *testing.T) {
			err := loadWithin(t, func() error {
				_, err := ruleset.Load(tt.path, descriptors.Options{})
				return err
			})
			if err == nil || !strings.Contains(err.Error(), tt.path) || !strings.Contains(err.Error(), "not a regular file") || !strings.Contains(err.Error(), tt.kind) {
				t.Errorf("Load(%s) = %v, want an error naming the file as not a regular file (%s)", tt.path, err, tt.kind)
			}
		})
	}
	// In a directory too: the FIFO is refused, not skipped or waited on.
	must(t, os.Remove(zero))
	must(t, os.WriteFile(filepath.Join(dir, "ok.yaml"), []byte(rulesYAML(1)), 0o644))
	err := loadWithin(t, func() error {
		_, err := ruleset.Load(dir, descriptors.Options{})
		return err
	})
	if err == nil || !strings.Contains(err.Error(), fifo) {
		t.Errorf("Load(dir with a FIFO) = %v, want an error naming %s", err, fifo)
	}
}

func TestLoadSizeCap(t *testing.T) {
	dir := t.TempDir()
	small := rulesYAML(10)
	must(t, os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(small), 0o644))
	// A comment pads b.yaml so that the two files together pass the cap.
	pad := "# " + strings.Repeat("x", 200) + "\n"
	must(t, os.WriteFile(filepath.Join(dir, "b.yaml"), []byte("domain: b\n"+pad), 0o644))
	total := int64(len(small) + len("domain: b\n"+pad))

	if _, err := ruleset.LoadLimited(dir, descriptors.Options{}, total); err != nil {
		t.Fatalf("rules of exactly the cap: %v", err)
	}
	_, err := ruleset.LoadLimited(dir, descriptors.Options{}, total-1)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "b.yaml")) || !strings.Contains(err.Error(), "--max-rule-bytes") {
		t.Errorf("rules one byte over the cap: %v, want an error naming b.yaml and --max-rule-bytes", err)
	}
	if !errors.Is(err, ruleset.ErrRulesTooLarge) {
		t.Errorf("err %v is not ErrRulesTooLarge", err)
	}
}

func TestLoadDefaultCapStopsABigFile(t *testing.T) {
	// A sparse file: 1 GiB long, no disk used. Without the cap Load would
	// read it all (and the parser would need several times as much).
	path := filepath.Join(t.TempDir(), "big.yaml")
	f, err := os.Create(path)
	must(t, err)
	must(t, f.Truncate(1<<30))
	must(t, f.Close())
	_, err = ruleset.Load(path, descriptors.Options{})
	if !errors.Is(err, ruleset.ErrRulesTooLarge) || !strings.Contains(err.Error(), path) {
		t.Errorf("Load of a 1 GiB file = %v, want ErrRulesTooLarge naming the file", err)
	}
}

func TestRuleFilesListsDanglingAndSkipsDirs(t *testing.T) {
	dir := t.TempDir()
	must(t, os.Mkdir(filepath.Join(dir, "sub.yaml"), 0o755))
	must(t, os.Symlink("nowhere.yaml", filepath.Join(dir, "x.yaml")))
	names, err := ruleset.RuleFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 1 || names[0] != filepath.Join(dir, "x.yaml") {
		t.Errorf("RuleFiles = %v, want only the dangling x.yaml (so that reading it fails loudly)", names)
	}
	if _, err := os.Stat(names[0]); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("x.yaml should dangle: %v", err)
	}
}

func TestLoadEmbeddedDefault(t *testing.T) {
	cfg, err := ruleset.Load("", descriptors.Options{})
	if err != nil {
		t.Fatalf("embedded rules: %v", err)
	}
	if cfg.Domain("edge") == nil || cfg.Len() < 5 {
		t.Errorf("embedded rules: domain edge with %d rules", cfg.Len())
	}
}

// TestLoadPathsIsOneSet: several paths are one rule set, as one directory
// holding all their files would be: a domain in two of them is refused
// (naming the later file) unless merged, and the cap counts them all.
func TestLoadPathsIsOneSet(t *testing.T) {
	dirA, dirB := t.TempDir(), t.TempDir()
	a := filepath.Join(dirA, "a.yaml")
	must(t, os.WriteFile(a, []byte(rulesYAML(10)), 0o644))
	b := filepath.Join(dirB, "b.yaml")
	must(t, os.WriteFile(b, []byte("domain: d\ndescriptors:\n  - key: other\n    rate_limit: {unit: minute, requests_per_unit: 3}\n"), 0o644))

	for _, paths := range [][]string{{a, b}, {dirA, dirB}, {a, dirB}} {
		_, err := ruleset.LoadPaths(paths, descriptors.Options{}, 0)
		if err == nil || !strings.Contains(err.Error(), b) || !strings.Contains(err.Error(), "duplicate domain") {
			t.Errorf("LoadPaths(%v) = %v, want a duplicate domain d blamed on b.yaml", paths, err)
		}
		cfg, err := ruleset.LoadPaths(paths, descriptors.Options{MergeDomains: true}, 0)
		if err != nil || cfg.Len() != 2 {
			t.Errorf("LoadPaths(%v) merged: %v rules, err %v; want 2 rules", paths, cfg.Len(), err)
		}
	}
	st, err := os.Stat(a)
	must(t, err)
	_, err = ruleset.LoadPaths([]string{a, b}, descriptors.Options{MergeDomains: true}, st.Size())
	if !errors.Is(err, ruleset.ErrRulesTooLarge) || !strings.Contains(err.Error(), b) {
		t.Errorf("LoadPaths over the cap with its second path: %v, want ErrRulesTooLarge naming b.yaml", err)
	}
	missing1, missing2 := filepath.Join(dirA, "x.yaml"), filepath.Join(dirB, "y")
	_, err = ruleset.LoadPaths([]string{missing1, a, missing2}, descriptors.Options{}, 0)
	if err == nil || !strings.Contains(err.Error(), missing1) || !strings.Contains(err.Error(), missing2) {
		t.Errorf("LoadPaths with two missing paths: %v, want both named", err)
	}
	cfg, err := ruleset.LoadPaths(nil, descriptors.Options{}, 0)
	if err != nil || cfg.Domain("edge") == nil {
		t.Errorf("LoadPaths(nil) = %v, want the embedded example", err)
	}
}

// TestRuleFilesWalksSubdirectories: envoyproxy/ratelimit's layout
// (runtime/<app>/config/*.yaml) loads from the runtime root: every rule
// file below --config is read, dot names skipped, symlinked directories
// followed, a directory reached twice (a loop, a second link) read once.
func TestRuleFilesWalksSubdirectories(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "ratelimit", "config")
	must(t, os.MkdirAll(cfg, 0o755))
	must(t, os.MkdirAll(filepath.Join(dir, ".git", "x"), 0o755))
	for _, name := range []string{"a.yaml", "ratelimit/config/b.yml", "ratelimit/config/notes.txt", ".git/x/c.yaml"} {
		must(t, os.WriteFile(filepath.Join(dir, name), []byte("domain: "+strings.ReplaceAll(name, "/", "_")+"\n"), 0o644))
	}
	must(t, os.Symlink(".", filepath.Join(cfg, "loop")))
	must(t, os.Symlink("ratelimit", filepath.Join(dir, "twice")))
	names, err := ruleset.RuleFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(dir, "a.yaml"), filepath.Join(cfg, "b.yml")}
	if !slices.Equal(names, want) {
		t.Errorf("RuleFiles = %q, want %q", names, want)
	}
	c, err := ruleset.Load(dir, descriptors.Options{})
	if err != nil || len(c.Domains()) != 2 {
		t.Fatalf("Load(%s) = %v domains, %v; want a.yaml's and b.yml's", dir, c.Domains(), err)
	}
	// The peer reads every file of its runtime directory: the one not
	// read says so.
	var warns []string
	for _, w := range c.Warnings() {
		warns = append(warns, w.Error())
	}
	want = []string{filepath.Join(cfg, "notes.txt") + ": not named *.yaml or *.yml, so not read (envoyproxy/ratelimit reads every file of its runtime directory); rename it, or move it out of the rules directory"}
	if !slices.Equal(warns, want) {
		t.Errorf("Load(%s).Warnings() = %q, want %q", dir, warns, want)
	}
}

// TestRuleFilesBounds: a tree deeper than MaxRuleDepth below --config is
// an error naming the bound, not a walk without end.
func TestRuleFilesBounds(t *testing.T) {
	dir := t.TempDir()
	deep := dir
	for range ruleset.MaxRuleDepth + 1 {
		deep = filepath.Join(deep, "d")
	}
	must(t, os.MkdirAll(deep, 0o755))
	must(t, os.WriteFile(filepath.Join(deep, "r.yaml"), []byte(rulesYAML(1)), 0o644))
	if _, err := ruleset.RuleFiles(dir); err == nil || !strings.Contains(err.Error(), "more than 8 directory levels") {
		t.Errorf("RuleFiles of a tree 9 levels deep = %v, want an error naming the bound", err)
	}
	if _, err := ruleset.RuleFiles(filepath.Join(dir, "d")); err != nil {
		t.Errorf("RuleFiles of a tree 8 levels deep = %v, want it read", err)
	}

	// The same walk with small bounds for directories and files.
	wide := t.TempDir()
	for i := range 4 {
		must(t, os.Mkdir(filepath.Join(wide, strconv.Itoa(i)), 0o755))
		must(t, os.WriteFile(filepath.Join(wide, strconv.Itoa(i), "r.yaml"), nil, 0o644))
	}
	if _, err := ruleset.RuleFilesWithin(wide, 8, 4, 100); err == nil || !strings.Contains(err.Error(), "more than 4 directories") {
		t.Errorf("RuleFiles of 5 directories, at most 4 = %v, want an error naming the bound", err)
	}
	if _, err := ruleset.RuleFilesWithin(wide, 8, 100, 3); err == nil || !strings.Contains(err.Error(), "more than 3 rule files") {
		t.Errorf("RuleFiles of 4 files, at most 3 = %v, want an error naming the bound", err)
	}
	if names, err := ruleset.RuleFilesWithin(wide, 8, 5, 4); err != nil || len(names) != 4 {
		t.Errorf("RuleFiles of 5 directories and 4 files within the bounds = %v, %v; want 4 files", names, err)
	}
}
