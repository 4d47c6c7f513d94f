package ruleset

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rls/sluice/descriptors"
)

// settleDelay is how long the watcher waits after a file event for more
// events before reading the rules, and then again before reading them a
// second time: a ConfigMap update (several creates, renames and removes)
// costs one reload, and a file rewritten in place is loaded only once two
// reads settleDelay apart agree.
const settleDelay = 100 * time.Millisecond

// maxSettleRounds bounds how many reads in a row may disagree (5 s at
// settleDelay) before the watcher gives up until the next change.
const maxSettleRounds = 50

// Reloader reloads the rule set at Path into Store: on demand (SIGHUP) and
// when the files change (Watch). A reload that fails keeps the running rules.
type Reloader struct {
	Path     string // file or directory, as --config
	Options  descriptors.Options
	MaxBytes int64 // cap on the rule files' bytes per load (--max-rule-bytes); 0 = DefaultMaxRuleBytes
	Store    *Store
	Log      *slog.Logger
	Metrics  *ReloadMetrics // nil records nothing
	// Clock times the loads (ratelimit_config_last_success_timestamp_seconds)
	// and Watch's settle timer; nil is the real clock. Tests pass a
	// clockwork.FakeClock and advance it past each settle.
	Clock clockwork.Clock
}

func (r *Reloader) clock() clockwork.Clock {
	if r.Clock == nil {
		return clockwork.NewRealClock()
	}
	return r.Clock
}

// Reload loads the rules again. On failure it logs every problem (with
// file:line:column), counts the error and returns it, keeping the running
// rules. On success it swaps the new rules in atomically, logs each warning
// (LogWarnings) and one line per rule added, removed or whose limits
// changed, and records the time.
func (r *Reloader) Reload() error { return r.apply(r.read()) }

// snapshot is one read of the rule files: their content or the error.
type snapshot struct {
	set *ruleSet
	err error
	fp  [sha256.Size]byte
}

func (r *Reloader) read() snapshot {
	set, err := readRuleSet([]string{r.Path}, r.MaxBytes)
	if err != nil {
		return snapshot{err: err, fp: sha256.Sum256([]byte("error\x00" + err.Error()))}
	}
	return snapshot{set: set, fp: set.fingerprint()}
}

// apply builds the rules read in snap and swaps them in, or logs and counts
// why it cannot.
func (r *Reloader) apply(snap snapshot) error {
	err := snap.err
	var cfg *descriptors.Config
	if err == nil {
		cfg, err = snap.set.build(r.Options)
	}
	if err != nil {
		r.Metrics.loaded(false, time.Time{})
		r.Log.Error("rule reload failed; keeping the running rules", "path", r.Path, "err", err)
		return err
	}
	old := r.Store.Swap(cfg)
	r.Metrics.loaded(true, r.clock().Now())
	LogWarnings(r.Log, cfg)
	changes := Diff(old, cfg)
	for _, c := range changes {
		r.Log.Info("rule "+c.Kind, "rule", c.Rule, "old", c.Old, "new", c.New)
	}
	r.Log.Info("rules reloaded", "path", r.Path, "rule_count", cfg.Len(), "changed", len(changes))
	return nil
}

// LogWarnings logs each warning of cfg (descriptors.Config.Warnings:
// what envoyproxy/ratelimit loads but sluice finds suspect) at level warn,
// with "at" (file:line:column) and "reason". `rls serve` calls it after
// its first load; Reload after each.
func LogWarnings(log *slog.Logger, cfg *descriptors.Config) {
	for _, w := range cfg.Warnings() {
		log.Warn("rule file warning", "at", strings.TrimSuffix(w.Error(), ": "+w.Reason), "reason", w.Reason)
	}
}

// Watch reloads when the rules change until ctx is done. It watches
// directories, not files (see newWatchSet): the directory holding --config,
// the rules directory, the directories really holding the rule files and
// those holding every symlink on the way. Before each read it resolves the
// path again and, when a symlink was swapped or a directory replaced, moves
// its watches there (logged as "following rule files"). That is what makes
// a Kubernetes ConfigMap update (the kubelet swaps the ..data symlink) and a
// swapped --config symlink or directory work, then and on every later edit.
//
// After an event it waits settleDelay for more, reads the files, waits
// settleDelay again and reads them again; it loads only when both reads
// agree, so that a file rewritten in place is not loaded half-written.
func (r *Reloader) Watch(ctx context.Context) error {
	clock := r.clock()
	var (
		w      *fsnotify.Watcher
		set    watchSet
		settle clockwork.Timer  // nil: nothing pending
		fire   <-chan time.Time // settle's channel; nil while nothing is pending
	)
	// arm (re)starts the settle timer; one is pending at a time.
	arm := func() {
		if settle != nil {
			settle.Stop()
		}
		settle = clock.NewTimer(settleDelay)
		fire = settle.Chan()
	}
	defer func() {
		if settle != nil {
			settle.Stop()
		}
		if w != nil {
			w.Close()
		}
	}()
	// rewatch moves the watches to where the rules are now. A new
	// fsnotify.Watcher replaces the old one when the directories changed:
	// re-adding a path whose directory was replaced would leave the old
	// inotify watch behind.
	rewatch := func() error {
		next := newWatchSet(r.Path)
		if w != nil && next.sameDirs(set) {
			set = next
			return nil
		}
		nw, err := fsnotify.NewWatcher()
		if err != nil {
			return err
		}
		var errs []error
		for _, dir := range next.dirs() {
			if err := nw.Add(dir); err != nil {
				errs = append(errs, err)
				delete(next, dir)
			}
		}
		if len(next) == 0 {
			nw.Close()
			return errors.Join(append(errs, errNothingToWatch)...)
		}
		if len(errs) > 0 {
			r.Log.Warn("some rule directories are not watched", "err", errors.Join(errs...))
		}
		if w == nil {
			r.Log.Info("watching rule files", "path", r.Path, "dirs", next.dirs())
		} else {
			w.Close()
			r.Log.Info("following rule files", "path", r.Path, "dirs", next.dirs(), "was", set.dirs())
		}
		w, set = nw, next
		return nil
	}
	if err := rewatch(); err != nil {
		return fmt.Errorf("watch rules at %s: %w", r.Path, err)
	}
	var (
		prev   *snapshot // the last read, while waiting for the files to settle
		rounds int
	)
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if !set.concerns(ev.Name) {
				continue // e.g. a log file written next to the rules
			}
			r.Log.Debug("rule files changed", "event", ev.String())
			arm()
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			r.Log.Warn("watching rules", "err", err)
		case <-fire:
			settle, fire = nil, nil
			// Watch first, then read: a change after this point is an event.
			if err := rewatch(); err != nil {
				r.Log.Warn("cannot move the rule watches; keeping the old ones", "path", r.Path, "err", err)
			}
			snap := r.read()
			if prev != nil && snap.fp == prev.fp {
				_ = r.apply(snap) // logged and counted by apply
				prev, rounds = nil, 0
				continue
			}
			if rounds++; rounds > maxSettleRounds {
				r.Metrics.loaded(false, time.Time{})
				r.Log.Error("rule files kept changing; not reloaded until they change again", "path", r.Path, "for", maxSettleRounds*settleDelay)
				prev, rounds = nil, 0
				continue
			}
			r.Log.Debug("rule files read; waiting for a second read to agree", "path", r.Path)
			prev = &snap
			arm()
		}
	}
}

// Change is one difference between two rule sets.
type Change struct {
	Kind     string // "added", "removed" or "changed"
	Rule     string // domain-qualified path
	Old, New string // the limits, empty when absent
}

// Diff lists the rules added, removed or changed from old to cur, by path.
func Diff(old, cur *descriptors.Config) []Change {
	before := map[string]string{}
	if old != nil {
		for _, r := range old.Rules() {
			before[r.Path] = limitsOf(r)
		}
	}
	var out []Change
	seen := map[string]bool{}
	for _, r := range cur.Rules() {
		seen[r.Path] = true
		now := limitsOf(r)
		prev, ok := before[r.Path]
		switch {
		case !ok:
			out = append(out, Change{Kind: "added", Rule: r.Path, New: now})
		case prev != now:
			out = append(out, Change{Kind: "changed", Rule: r.Path, Old: prev, New: now})
		}
	}
	if old != nil {
		for _, r := range old.Rules() {
			if !seen[r.Path] {
				out = append(out, Change{Kind: "removed", Rule: r.Path, Old: before[r.Path]})
			}
		}
	}
	return out
}

// limitsOf is a rule's /rlconfig line without its path.
func limitsOf(r *descriptors.Rule) string {
	s := r.String()
	if len(s) > len(r.Path)+2 && s[:len(r.Path)] == r.Path {
		return s[len(r.Path)+2:]
	}
	return s
}

// ReloadMetrics count rule loads. Build with NewReloadMetrics; nil records
// nothing.
type ReloadMetrics struct {
	loads       *prometheus.CounterVec
	lastSuccess prometheus.Gauge
	lastOK      prometheus.Gauge
}

// NewReloadMetrics creates ratelimit_config_loads_total,
// ratelimit_config_last_success_timestamp_seconds and
// ratelimit_config_last_load_successful on reg.
func NewReloadMetrics(reg prometheus.Registerer) *ReloadMetrics {
	m := &ReloadMetrics{
		loads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_config_loads_total",
			Help: "Rule loads (start and reloads), by result.",
		}, []string{"result"}),
		lastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_config_last_success_timestamp_seconds",
			Help: "Unix time of the last successful rule load.",
		}),
		lastOK: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ratelimit_config_last_load_successful",
			Help: "1 when the last rule load succeeded, 0 while the rule files on disk are rejected (the previous rules run).",
		}),
	}
	m.loads.WithLabelValues("success")
	m.loads.WithLabelValues("error")
	reg.MustRegister(m.loads, m.lastSuccess, m.lastOK)
	return m
}

// Loaded records a load made outside Reload (the one at start).
func (m *ReloadMetrics) Loaded(ok bool, at time.Time) { m.loaded(ok, at) }

func (m *ReloadMetrics) loaded(ok bool, at time.Time) {
	if m == nil {
		return
	}
	if !ok {
		m.loads.WithLabelValues("error").Inc()
		m.lastOK.Set(0)
		return
	}
	m.loads.WithLabelValues("success").Inc()
	m.lastOK.Set(1)
	m.lastSuccess.Set(float64(at.UnixNano()) / 1e9)
}
