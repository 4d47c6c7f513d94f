package ruleset_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/goleak"

	"github.com/sluice-rls/sluice/ruleset"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// watchClock is the fake clock of a watcher under test: its settle timer
// fires only when the test advances the clock past it.
type watchClock struct{ *clockwork.FakeClock }

// armed reports whether the watcher has armed its settle timer, waiting up
// to d for it: the timer follows file events, which arrive when the kernel
// sends them.
func (c watchClock) armed(d time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return c.BlockUntilContext(ctx, 1) == nil
}

// settle advances the clock past every settle timer the watcher arms until
// cond holds, checking between advances that never (if given) stays
// false. It fails after a deadline or too many advances.
//
// cond is checked again between finding a timer armed and advancing past
// it: the watcher logs what it did before it arms its next timer, so when
// cond is about the log, a timer armed after cond turned true is never
// fired. One advance is not always one read: an event that comes with the
// timer's fire restarts the timer, as it should.
func (c watchClock) settle(t *testing.T, what string, cond, never func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	advances := 0
	for !cond() {
		if never != nil && never() {
			t.Fatalf("while waiting for %s: a state that must never happen", what)
		}
		if time.Now().After(deadline) || advances > 2*ruleset.MaxSettleRounds {
			t.Fatalf("timed out waiting for %s (%d settle intervals)", what, advances)
		}
		if c.armed(5*time.Millisecond) && !cond() {
			c.Advance(ruleset.SettleDelay)
			advances++
		}
	}
}

// startWatch runs f.r.Watch on a fake clock until the test ends, and waits
// until its watches are in place.
func startWatch(t *testing.T, f *fixture) watchClock {
	t.Helper()
	c := watchClock{clockwork.NewFakeClock()}
	f.r.Clock = c
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.r.Watch(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Watch did not return within 10s of its context's end (stuck in a read?)")
		}
	})
	waitFor(t, "the watcher to start", func() bool { return strings.Contains(f.log.String(), "watching rule files") })
	return c
}

func writeRules(t *testing.T, path string, limit int) {
	t.Helper()
	must(t, os.WriteFile(path, []byte(rulesYAML(limit)), 0o644))
}

// TestWatchFollowsDirectorySwap: the rules directory is replaced by
// another (mv rules rules.old; mv rules.new rules). The old watch stays on
// rules.old; the watcher must see the swap and the edits after it.
func TestWatchFollowsDirectorySwap(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "rules")
	must(t, os.Mkdir(dir, 0o755))
	writeRules(t, filepath.Join(dir, "rules.yaml"), 10)
	f := newFixture(t, dir)
	c := startWatch(t, f)

	must(t, os.Mkdir(filepath.Join(base, "rules.new"), 0o755))
	writeRules(t, filepath.Join(base, "rules.new", "rules.yaml"), 20)
	must(t, os.Rename(dir, filepath.Join(base, "rules.old")))
	must(t, os.Rename(filepath.Join(base, "rules.new"), dir))
	c.settle(t, "the swapped directory to load", func() bool { return limitOf(t, f.store) == 20 }, nil)

	writeRules(t, filepath.Join(dir, "rules.yaml"), 30)
	c.settle(t, "an edit in the new directory to load", func() bool { return limitOf(t, f.store) == 30 }, nil)
	if !strings.Contains(f.log.String(), "following rule files") {
		t.Errorf("the log does not say the watches moved:\n%s", f.log)
	}
}

// TestWatchFollowsConfigSymlinkSwap: --config is a symlink to a versioned
// directory, swapped atomically to the next version (envoyproxy/ratelimit's
// runtime root, or a release's "current" link).
func TestWatchFollowsConfigSymlinkSwap(t *testing.T) {
	base := t.TempDir()
	for i, limit := range []int{10, 20} {
		v := filepath.Join(base, "v"+string(rune('1'+i)))
		must(t, os.Mkdir(v, 0o755))
		writeRules(t, filepath.Join(v, "rules.yaml"), limit)
	}
	current := filepath.Join(base, "current")
	must(t, os.Symlink("v1", current))
	f := newFixture(t, current)
	c := startWatch(t, f)

	must(t, os.Symlink("v2", filepath.Join(base, "current.tmp")))
	must(t, os.Rename(filepath.Join(base, "current.tmp"), current))
	c.settle(t, "the swapped link to load", func() bool { return limitOf(t, f.store) == 20 }, nil)

	writeRules(t, filepath.Join(base, "v2", "rules.yaml"), 30)
	c.settle(t, "an edit behind the new link to load", func() bool { return limitOf(t, f.store) == 30 }, nil)
}

// TestWatchFollowsRuntimeRootSwap: envoyproxy/ratelimit's layout, where
// the swapped link is a directory above --config
// (RUNTIME_ROOT/current/ratelimit/config).
func TestWatchFollowsRuntimeRootSwap(t *testing.T) {
	base := t.TempDir()
	for i, limit := range []int{10, 20} {
		cfg := filepath.Join(base, "data-"+string(rune('1'+i)), "ratelimit", "config")
		must(t, os.MkdirAll(cfg, 0o755))
		writeRules(t, filepath.Join(cfg, "rules.yaml"), limit)
	}
	must(t, os.Symlink("data-1", filepath.Join(base, "current")))
	f := newFixture(t, filepath.Join(base, "current", "ratelimit", "config"))
	c := startWatch(t, f)

	must(t, os.Symlink("data-2", filepath.Join(base, "current.tmp")))
	must(t, os.Rename(filepath.Join(base, "current.tmp"), filepath.Join(base, "current")))
	c.settle(t, "the swapped root to load", func() bool { return limitOf(t, f.store) == 20 }, nil)

	writeRules(t, filepath.Join(base, "data-2", "ratelimit", "config", "rules.yaml"), 30)
	c.settle(t, "an edit under the new root to load", func() bool { return limitOf(t, f.store) == 30 }, nil)
}

// TestWatchFollowsRuleFileSymlinkSwap: --config is a symlink to a file in
// another directory; after the link moves to a third directory, edits
// there must still reload.
func TestWatchFollowsRuleFileSymlinkSwap(t *testing.T) {
	base := t.TempDir()
	for _, d := range []string{"etc", "a", "b"} {
		must(t, os.Mkdir(filepath.Join(base, d), 0o755))
	}
	writeRules(t, filepath.Join(base, "a", "limits.yml"), 10)
	writeRules(t, filepath.Join(base, "b", "limits.yml"), 20)
	link := filepath.Join(base, "etc", "rules.yaml")
	must(t, os.Symlink(filepath.Join(base, "a", "limits.yml"), link))
	f := newFixture(t, link)
	c := startWatch(t, f)

	writeRules(t, filepath.Join(base, "a", "limits.yml"), 15)
	c.settle(t, "an edit of the link's target to load", func() bool { return limitOf(t, f.store) == 15 }, nil)

	must(t, os.Symlink(filepath.Join(base, "b", "limits.yml"), link+".tmp"))
	must(t, os.Rename(link+".tmp", link))
	c.settle(t, "the swapped link to load", func() bool { return limitOf(t, f.store) == 20 }, nil)

	writeRules(t, filepath.Join(base, "b", "limits.yml"), 30)
	c.settle(t, "an edit of the new target to load", func() bool { return limitOf(t, f.store) == 30 }, nil)
}

// TestWatchInPlaceRewriteWaitsToSettle: a file rewritten in place is seen
// half-written by a read between the writer's writes. Here the half is a
// valid file without the rule, which a plain reload would apply.
func TestWatchInPlaceRewriteWaitsToSettle(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	writeRules(t, file, 10)
	f := newFixture(t, dir)
	c := startWatch(t, f)
	lost := func() bool {
		r := f.store.Rules().Domain("d")
		return r == nil || len(r.Rules()) == 0
	}

	full := rulesYAML(30)
	half := full[:strings.Index(full, "descriptors:")]
	out, err := os.OpenFile(file, os.O_WRONLY|os.O_TRUNC, 0)
	must(t, err)
	defer out.Close()
	_, err = out.WriteString(half)
	must(t, err)
	// The settle interval after the first write passes: the watcher reads
	// the half-written file, and must wait for a second read to agree (the
	// timer for that read is never fired here).
	const read = "waiting for a second read to agree"
	c.settle(t, "the watcher to read the half-written file", func() bool { return strings.Contains(f.log.String(), read) }, lost)
	if got := f.loads(t, "success"); got != 0 {
		t.Fatalf("%v loads after one read, want none until a second read agrees", got)
	}
	_, err = out.WriteString(full[len(half):])
	must(t, err)
	c.settle(t, "the whole file to load", func() bool { return !lost() && limitOf(t, f.store) == 30 }, lost)
	if got := f.loads(t, "success"); got != 1 {
		t.Errorf("%v successful loads, want 1 (the whole file)", got)
	}
}

// TestWatchSurvivesFIFO: a FIFO among the rule files used to block the
// watcher's read forever, so that no later change was ever loaded.
func TestWatchSurvivesFIFO(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	writeRules(t, file, 10)
	f := newFixture(t, dir)
	c := startWatch(t, f)

	fifo := filepath.Join(dir, "pipe.yaml")
	must(t, syscall.Mkfifo(fifo, 0o644))
	// The load is counted, then logged: wait for both.
	c.settle(t, "the FIFO to be refused", func() bool {
		return f.loads(t, "error") == 1 && strings.Contains(f.log.String(), "not a regular file")
	}, nil)
	if log := f.log.String(); !strings.Contains(log, fifo) {
		t.Errorf("the log does not name the FIFO:\n%s", log)
	}
	if got := limitOf(t, f.store); got != 10 {
		t.Errorf("limit %d after the refused FIFO, want the running 10", got)
	}
	must(t, os.Remove(fifo))
	writeRules(t, file, 20)
	c.settle(t, "the next edit to load", func() bool { return limitOf(t, f.store) == 20 }, nil)
}

// TestWatchDanglingLinkKeepsRules: a rule link left dangling by a swap is
// an error that keeps every running rule, and the fix reloads.
func TestWatchDanglingLinkKeepsRules(t *testing.T) {
	dir := t.TempDir()
	writeRules(t, filepath.Join(dir, "rules.yaml"), 10)
	must(t, os.WriteFile(filepath.Join(dir, "target-b"), []byte("domain: b\n"), 0o644))
	must(t, os.Symlink("target-b", filepath.Join(dir, "b.yaml")))
	f := newFixture(t, dir)
	c := startWatch(t, f)

	must(t, os.Remove(filepath.Join(dir, "target-b")))
	// The load is counted, then logged: wait for both.
	failed := func() bool { return f.loads(t, "error") == 1 && strings.Contains(f.log.String(), "rule reload failed") }
	c.settle(t, "the dangling link to fail the load", failed, func() bool { return f.store.Rules().Domain("b") == nil })
	if !strings.Contains(f.log.String(), "dangling symlink") {
		t.Errorf("the log does not say why:\n%s", f.log)
	}
	must(t, os.WriteFile(filepath.Join(dir, "target-b"), []byte("domain: b\n"), 0o644))
	writeRules(t, filepath.Join(dir, "rules.yaml"), 20)
	c.settle(t, "the repaired rules to load", func() bool { return limitOf(t, f.store) == 20 }, nil)
}

// TestWatchGivesUpOnFilesThatNeverSettle: a file that differs at every read
// is never loaded; after MaxSettleRounds reads the watcher gives up until
// the next change, logs and counts it, and the next change loads.
func TestWatchGivesUpOnFilesThatNeverSettle(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	writeRules(t, file, 10)
	f := newFixture(t, dir)
	c := startWatch(t, f)

	// Each write waits for the watcher's next read, which logs either that
	// it waits for a second read or that it gives up.
	const read, gaveUp = "waiting for a second read to agree", "rule files kept changing"
	for i := 0; !strings.Contains(f.log.String(), gaveUp); i++ {
		if i > ruleset.MaxSettleRounds {
			t.Fatalf("the watcher did not give up after %d changing reads:\n%s", i, f.log)
		}
		writeRules(t, file, 100+i) // differs from the last read
		c.settle(t, "the next read", func() bool {
			log := f.log.String()
			return strings.Count(log, read) > i || strings.Contains(log, gaveUp)
		}, nil)
	}
	if got := strings.Count(f.log.String(), read); got != ruleset.MaxSettleRounds {
		t.Errorf("%d reads waited for a second one before the watcher gave up, want %d", got, ruleset.MaxSettleRounds)
	}
	if got := limitOf(t, f.store); got != 10 {
		t.Errorf("limit %d while the file kept changing, want the running 10", got)
	}
	if got, ok := f.loads(t, "error"), f.loads(t, "success"); got != 1 || ok != 0 {
		t.Errorf("loads: %v errors, %v successes; want 1 error (giving up), no success", got, ok)
	}
	writeRules(t, file, 20)
	c.settle(t, "the next change to load", func() bool { return limitOf(t, f.store) == 20 }, nil)
}

// TestWatchSubdirectories: fsnotify does not recurse, yet an edit in a
// subdirectory of --config, a new subdirectory with a rule file and a
// file in it after that must each reload.
func TestWatchSubdirectories(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "app", "config")
	must(t, os.MkdirAll(sub, 0o755))
	writeRules(t, filepath.Join(sub, "rules.yaml"), 10)
	f := newFixture(t, dir)
	c := startWatch(t, f)

	writeRules(t, filepath.Join(sub, "rules.yaml"), 20)
	c.settle(t, "an edit two levels down to load", func() bool { return limitOf(t, f.store) == 20 }, nil)

	// A new subdirectory holding the only rule file of domain e.
	other := filepath.Join(dir, "other")
	must(t, os.Mkdir(other, 0o755))
	must(t, os.WriteFile(filepath.Join(other, "e.yaml"), []byte("domain: e\n"), 0o644))
	c.settle(t, "a new subdirectory to load", func() bool { return f.store.Rules().Domain("e") != nil }, nil)

	nested := filepath.Join(other, "nested")
	must(t, os.Mkdir(nested, 0o755))
	must(t, os.WriteFile(filepath.Join(nested, "g.yaml"), []byte("domain: g\n"), 0o644))
	c.settle(t, "a subdirectory of the new one to load", func() bool { return f.store.Rules().Domain("g") != nil }, nil)

	must(t, os.RemoveAll(other))
	c.settle(t, "a removed subdirectory to unload", func() bool { return f.store.Rules().Domain("e") == nil }, nil)
}

// TestWatchFollowsRuntimeRootSwapWithSubdirs: --config is
// envoyproxy/ratelimit's runtime root itself, a symlink swapped to a new
// version (its default reload), holding the rules in
// <root>/ratelimit/config.
func TestWatchFollowsRuntimeRootSwapWithSubdirs(t *testing.T) {
	base := t.TempDir()
	for i, limit := range []int{10, 20} {
		cfg := filepath.Join(base, "data-"+string(rune('1'+i)), "ratelimit", "config")
		must(t, os.MkdirAll(cfg, 0o755))
		writeRules(t, filepath.Join(cfg, "rules.yaml"), limit)
	}
	current := filepath.Join(base, "current")
	must(t, os.Symlink("data-1", current))
	f := newFixture(t, current)
	c := startWatch(t, f)

	must(t, os.Symlink("data-2", current+".tmp"))
	must(t, os.Rename(current+".tmp", current))
	c.settle(t, "the swapped root to load", func() bool { return limitOf(t, f.store) == 20 }, nil)

	writeRules(t, filepath.Join(base, "data-2", "ratelimit", "config", "rules.yaml"), 30)
	c.settle(t, "an edit under the new root to load", func() bool { return limitOf(t, f.store) == 30 }, nil)
}
