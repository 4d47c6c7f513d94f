package adaptive_test

import (
	"context"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/sluice-rls/sluice/adaptive"
	"github.com/sluice-rls/sluice/audit"
	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/internal/audittest"
	"github.com/sluice-rls/sluice/override"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const rulesYAML = `domain: edge
descriptors:
  - key: user_id
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: login
    protected: true
    rate_limit: {unit: second, requests_per_unit: 10}
`

// source is a fake Source: the test sets each query's value or error.
type source struct {
	mu    sync.Mutex
	v     map[string]float64
	err   error
	calls int
}

func (s *source) Query(_ context.Context, q string) (float64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.err != nil {
		return 0, s.err
	}
	v, ok := s.v[q]
	if !ok {
		return 0, adaptive.ErrEmpty
	}
	return v, nil
}

func (s *source) set(q string, v float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.v[q] = v
}

// lock is a Lock the test hands over.
type lock struct {
	mu   sync.Mutex
	held bool
	err  error
}

func (l *lock) Hold(context.Context) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held && l.err == nil, l.err
}
func (l *lock) Release(context.Context) error { return nil }

// rig is a controller on a real override.Manager (a memory store), a fake
// clock and a fake source.
type rig struct {
	clock *clockwork.FakeClock
	src   *source
	mgr   *override.Manager
	ctl   *adaptive.Controller
	rec   *audittest.Recorder
	reg   *prometheus.Registry
	cfg   *adaptive.Config
	rules func() *descriptors.Config
}

func newRig(t *testing.T, yaml string, lk adaptive.Lock) *rig {
	t.Helper()
	f, err := descriptors.Parse("r.yaml", []byte(rulesYAML))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := descriptors.New([]*descriptors.File{f}, descriptors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := adaptive.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	store, _ := override.OpenFile("")
	r := &rig{clock: clockwork.NewFakeClockAt(time.Date(2026, 12, 5, 3, 0, 0, 0, time.UTC)), src: &source{v: map[string]float64{}},
		rec: &audittest.Recorder{}, reg: prometheus.NewRegistry(), cfg: cfg, rules: func() *descriptors.Config { return rules }}
	r.mgr = override.NewManager(override.ManagerOptions{Store: store, Rules: func() *descriptors.Config { return rules }, Clock: r.clock})
	r.ctl = adaptive.New(adaptive.Options{Config: cfg, Source: r.src, Overrides: r.mgr, Rules: func() *descriptors.Config { return rules },
		Lock: lk, Clock: r.clock, Audit: r.rec, Node: "n1", Registerer: r.reg})
	return r
}

// step advances the clock by d and steps.
func (r *rig) step(d time.Duration) {
	r.clock.Advance(d)
	r.ctl.Step(context.Background())
}

// scale is the scale override on scope (domain, rule) this node applies,
// and its author; 1 and "" without one.
func (r *rig) scale(domain, rule string) (float64, string) {
	for _, o := range r.mgr.List() {
		if o.Kind == override.KindScale && o.Domain == domain && o.Rule == rule {
			return o.Factor, o.Author
		}
	}
	return 1, ""
}

func (r *rig) kinds() []string {
	var out []string
	for _, e := range r.rec.Events() {
		out = append(out, e.Kind)
	}
	return out
}

const latencyPolicy = `prometheus: http://127.0.0.1:1
policies:
  - name: latency
    domain: edge
    rule: edge.user_id
    interval: 1s
    cooldown: 1s
    stale_after: 5s
    min_scale: 0.5
    signals:
      - {name: p99, query: p99, lower_above: 1, raise_below: 0.2}
`

func TestTriggerAndRestore(t *testing.T) {
	t.Parallel()
	r := newRig(t, latencyPolicy, nil)
	r.src.set("p99", 0.5)
	r.step(0)
	if s, _ := r.scale("edge", "edge.user_id"); s != 1 {
		t.Fatalf("between the thresholds: scale %v, want 1", s)
	}
	r.src.set("p99", 2)
	var got []float64
	for range 5 {
		r.step(time.Second)
		s, author := r.scale("edge", "edge.user_id")
		if author != "" && author != adaptive.Author {
			t.Fatalf("override author %q, want %q", author, adaptive.Author)
		}
		got = append(got, s)
	}
	want := []float64{0.8, 0.64, 0.512, 0.5, 0.5} // never below min_scale
	if !equal(got, want) {
		t.Fatalf("scales while p99 is high: %v, want %v", got, want)
	}
	o := r.mgr.List()[0]
	if !strings.Contains(o.Reason, "p99=2 above 1") || !o.Expires.Equal(r.clock.Now().Add(-time.Second).Add(adaptive.DefaultExpiry)) {
		t.Errorf("override %+v: want the signal value in its reason and an expiry an hour after it was written", o)
	}
	if v := r.metric("ratelimit_adaptive_triggered"); v != 1 {
		t.Errorf("ratelimit_adaptive_triggered = %v while lowered, want 1", v)
	}
	r.src.set("p99", 0.1)
	got = nil
	for range 9 {
		r.step(time.Second)
		s, _ := r.scale("edge", "edge.user_id")
		got = append(got, s)
	}
	want = []float64{0.55, 0.605, 0.6655, 0.7321, 0.8053, 0.8858, 0.9744, 1, 1}
	if !equal(got, want) {
		t.Fatalf("scales after recovery: %v, want %v", got, want)
	}
	if len(r.mgr.List()) != 0 {
		t.Errorf("back at 1, overrides %v remain: the policy's override must be removed", r.mgr.List())
	}
	kinds := r.kinds()
	if kinds[0] != audit.KindAdaptiveTrigger || kinds[len(kinds)-1] != audit.KindAdaptiveRestore || len(kinds) != 2 {
		t.Errorf("audit events %v, want one trigger and one restore", kinds)
	}
	if e := r.rec.Events()[0]; !strings.Contains(e.Reason, "p99=2") || e.Subject != "latency" || e.Changes[0].New != "scale ×0.8" {
		t.Errorf("trigger event %+v", e)
	}
	if v := r.metric("ratelimit_adaptive_triggers_total"); v != 1 {
		t.Errorf("ratelimit_adaptive_triggers_total = %v, want 1", v)
	}
}

// metric is the value of the one series of name in r's registry (a gauge
// or a counter); -Inf when there is none.
func (r *rig) metric(name string) float64 {
	mfs, _ := r.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			m := mf.GetMetric()[0]
			return m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return math.Inf(-1)
}

func equal(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Abs(a[i]-b[i]) > 1e-9 {
			return false
		}
	}
	return true
}

func TestOneMovePerCooldown(t *testing.T) {
	t.Parallel()
	r := newRig(t, strings.Replace(latencyPolicy, "cooldown: 1s", "cooldown: 3s", 1), nil)
	r.src.set("p99", 2)
	var got []float64
	for range 7 {
		r.step(time.Second)
		s, _ := r.scale("edge", "edge.user_id")
		got = append(got, s)
	}
	if want := []float64{0.8, 0.8, 0.8, 0.64, 0.64, 0.64, 0.512}; !equal(got, want) {
		t.Errorf("scales every second with a 3 s cooldown: %v, want %v", got, want)
	}
}

func TestNoSignalHoldsThenReturnsToOne(t *testing.T) {
	t.Parallel()
	r := newRig(t, latencyPolicy, nil)
	r.src.set("p99", 2)
	r.step(time.Second)
	r.src.mu.Lock()
	r.src.err = context.DeadlineExceeded
	r.src.mu.Unlock()
	for i := range 4 { // stale_after 5s: held at 1 s .. 4 s after the last good read
		r.step(time.Second)
		if s, _ := r.scale("edge", "edge.user_id"); s != 0.8 {
			t.Fatalf("%d s without a signal: scale %v, want 0.8 held", i+1, s)
		}
	}
	if v := r.metric("ratelimit_adaptive_signal"); !math.IsNaN(v) {
		t.Errorf("ratelimit_adaptive_signal = %v without a signal, want NaN", v)
	}
	r.step(time.Second)
	if s, _ := r.scale("edge", "edge.user_id"); s != 1 {
		t.Errorf("stale_after without a signal: scale %v, want 1", s)
	}
}

func TestProtectedNeverAboveItsFileLimit(t *testing.T) {
	t.Parallel()
	r := newRig(t, `prometheus: http://127.0.0.1:1
policies:
  - name: login
    domain: edge
    rule: edge.login
    interval: 1s
    cooldown: 1s
    max_scale: 3
    signals: [{name: p99, query: p99, lower_above: 1, raise_below: 0.2}]
`, nil)
	r.src.set("p99", 0.1)
	for range 5 {
		r.step(time.Second)
		if s, _ := r.scale("edge", "edge.login"); s != 1 {
			t.Fatalf("protected rule scaled to %v, want at most 1", s)
		}
	}
}

func TestOperatorOverrideWins(t *testing.T) {
	t.Parallel()
	r := newRig(t, latencyPolicy, nil)
	ctx := context.Background()
	r.src.set("p99", 2)
	r.step(time.Second) // 0.8
	// The operator's scale on the same rule replaces the policy's.
	if _, err := r.mgr.Set(ctx, override.Override{Domain: "edge", Rule: "edge.user_id", Kind: override.KindScale, Factor: 0.3, Reason: "incident"}, "alice"); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		r.step(time.Second)
		if s, author := r.scale("edge", "edge.user_id"); s != 0.3 || author != "alice" {
			t.Fatalf("operator's override: scale %v by %q, want 0.3 by alice", s, author)
		}
	}
	list := r.mgr.List()
	if _, err := r.mgr.Remove(ctx, list[0].ID, "alice", "over"); err != nil {
		t.Fatal(err)
	}
	r.step(time.Second)
	if s, author := r.scale("edge", "edge.user_id"); s != 0.8 || author != adaptive.Author {
		t.Fatalf("operator's override gone: scale %v by %q, want the policy's 0.8", s, author)
	}
	// An operator's domain-wide scale wins too: the policy's rule scale
	// (more specific) is removed, so the operator's applies.
	if _, err := r.mgr.Set(ctx, override.Override{Domain: "edge", Kind: override.KindScale, Factor: 0.5, Reason: "incident"}, "alice"); err != nil {
		t.Fatal(err)
	}
	r.step(time.Second)
	if s, _ := r.scale("edge", "edge.user_id"); s != 1 {
		t.Errorf("operator's domain scale: the policy's rule scale %v remains, want it removed", s)
	}
}

func TestDryRunWritesNothing(t *testing.T) {
	t.Parallel()
	r := newRig(t, strings.Replace(latencyPolicy, "policies:", "dry_run: true\npolicies:", 1), nil)
	r.src.set("p99", 2)
	r.step(time.Second)
	r.step(time.Second)
	if len(r.mgr.List()) != 0 || len(r.rec.Events()) != 0 {
		t.Errorf("dry run wrote overrides %v, events %v", r.mgr.List(), r.rec.Events())
	}
	if v := r.metric("ratelimit_adaptive_scale"); v != 0.64 {
		t.Errorf("dry run: ratelimit_adaptive_scale = %v, want the would-be 0.64", v)
	}
}

func TestOnlyTheActorActs(t *testing.T) {
	t.Parallel()
	lk := &lock{}
	r := newRig(t, latencyPolicy, lk)
	r.src.set("p99", 2)
	r.step(time.Second)
	r.step(time.Second)
	if r.src.calls != 0 || len(r.mgr.List()) != 0 {
		t.Fatalf("not the actor: %d queries, overrides %v; want none", r.src.calls, r.mgr.List())
	}
	lk.mu.Lock()
	lk.held = true
	lk.mu.Unlock()
	r.step(time.Second)
	if s, _ := r.scale("edge", "edge.user_id"); s != 0.8 {
		t.Errorf("the actor: scale %v, want 0.8", s)
	}
	if v := r.metric("ratelimit_adaptive_actor"); v != 1 {
		t.Errorf("ratelimit_adaptive_actor = %v, want 1", v)
	}
	// The lock unreachable: the node cannot tell whether it acts, so it
	// does not.
	lk.mu.Lock()
	lk.err = context.DeadlineExceeded
	lk.mu.Unlock()
	calls := r.src.calls
	r.step(time.Second)
	r.step(time.Second)
	if r.src.calls != calls || r.metric("ratelimit_adaptive_actor") != 0 {
		t.Errorf("lock unreachable: %d more queries, actor %v; want none and 0", r.src.calls-calls, r.metric("ratelimit_adaptive_actor"))
	}
	if s, _ := r.scale("edge", "edge.user_id"); s != 0.8 {
		t.Errorf("lock unreachable: scale %v, want 0.8 left as it was", s)
	}
}

// TestOverrideRefreshed: a scale that holds is rewritten when half of its
// override's expiry is left, so it does not lapse while the policy holds it.
func TestOverrideRefreshed(t *testing.T) {
	t.Parallel()
	r := newRig(t, latencyPolicy, nil)
	r.src.set("p99", 2)
	r.step(time.Second)
	r.src.set("p99", 0.5) // between the thresholds: holds 0.8
	r.step(adaptive.DefaultExpiry/2 - time.Second)
	if o := r.mgr.List()[0]; !o.Expires.Equal(r.clock.Now().Add(time.Second + adaptive.DefaultExpiry/2)) {
		t.Fatalf("more than half the expiry left: override rewritten (expires %v)", o.Expires)
	}
	r.step(2 * time.Second)
	o := r.mgr.List()[0]
	if o.Factor != 0.8 || !o.Expires.Equal(r.clock.Now().Add(adaptive.DefaultExpiry)) || !strings.Contains(o.Reason, "refreshed") {
		t.Errorf("less than half the expiry left: override %v, want 0.8 rewritten to expire an hour from now", o)
	}
}
