package config

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rls/sluice/descriptors"
)

// settleDelay is how long the watcher waits after a file event for more
// events before reloading, so that a ConfigMap update (several creates,
// renames and removes) costs one reload.
const settleDelay = 100 * time.Millisecond

// Reloader reloads the rule set at Path into Store: on demand (SIGHUP) and
// when the files change (Watch). A reload that fails keeps the running rules.
type Reloader struct {
	Path     string // file or directory, as --config
	Options  descriptors.Options
	MaxBytes int64 // cap on the rule files' bytes per load (--max-rule-bytes); 0 = DefaultMaxRuleBytes
	Store    *Store
	Log      *slog.Logger
	Metrics  *ReloadMetrics   // nil records nothing
	Now      func() time.Time // nil = time.Now
}

// Reload loads the rules again. On failure it logs every problem (with
// file:line:column), counts the error and returns it, keeping the running
// rules. On success it swaps the new rules in atomically, logs one line per
// rule added, removed or whose limits changed, and records the time.
func (r *Reloader) Reload() error {
	cfg, err := LoadLimited(r.Path, r.Options, r.MaxBytes)
	if err != nil {
		r.Metrics.loaded(false, time.Time{})
		r.Log.Error("rule reload failed; keeping the running rules", "path", r.Path, "err", err)
		return err
	}
	old := r.Store.Swap(cfg)
	now := time.Now
	if r.Now != nil {
		now = r.Now
	}
	r.Metrics.loaded(true, now())
	changes := Diff(old, cfg)
	for _, c := range changes {
		r.Log.Info("rule "+c.Kind, "rule", c.Rule, "old", c.Old, "new", c.New)
	}
	r.Log.Info("rules reloaded", "path", r.Path, "rule_count", cfg.Len(), "changed", len(changes))
	return nil
}

// Watch reloads when anything changes in the directory holding the rules
// (the rules directory itself, or a rule file's directory) until ctx is
// done. Watching the directory, not the files, is what makes a Kubernetes
// ConfigMap update work: the kubelet swaps the ..data symlink, and the
// files' own watches would never fire.
func (r *Reloader) Watch(ctx context.Context) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch rules: %w", err)
	}
	defer w.Close()
	dir := r.Path
	if st, err := os.Stat(dir); err == nil && !st.IsDir() {
		dir = filepath.Dir(dir)
	}
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("watch rules in %s: %w", dir, err)
	}
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	defer settle.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if !r.concerns(ev.Name) {
				continue // e.g. a log file written next to the rules
			}
			r.Log.Debug("rule directory changed", "event", ev.String())
			settle.Reset(settleDelay)
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			r.Log.Warn("watching rules", "err", err)
		case <-settle.C:
			_ = r.Reload() // logged and counted by Reload
		}
	}
}

// concerns reports whether a change to name can change the rules: a rule
// file (the --config file itself, or a *.yaml / *.yml of the directory), or
// the ..data link of a Kubernetes ConfigMap volume, which the kubelet swaps.
func (r *Reloader) concerns(name string) bool {
	base := filepath.Base(name)
	if strings.HasPrefix(base, "..data") {
		return true
	}
	if st, err := os.Stat(r.Path); err == nil && !st.IsDir() {
		return base == filepath.Base(r.Path)
	}
	return isRuleFile(base)
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
}

// NewReloadMetrics creates ratelimit_config_loads_total and
// ratelimit_config_last_success_timestamp_seconds on reg.
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
	}
	m.loads.WithLabelValues("success")
	m.loads.WithLabelValues("error")
	reg.MustRegister(m.loads, m.lastSuccess)
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
		return
	}
	m.loads.WithLabelValues("success").Inc()
	m.lastSuccess.Set(float64(at.UnixNano()) / 1e9)
}
