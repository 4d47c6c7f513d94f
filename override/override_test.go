package override_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/goleak"

	"github.com/sluice-rls/sluice/audit"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/internal/audittest"
	"github.com/sluice-rls/sluice/override"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const rulesYAML = `domain: edge
descriptors:
  - key: user_id
    rate_limit: {unit: second, requests_per_unit: 10, burst: 20}
  - key: login
    protected: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: ip
    rate_limit:
      unit: second
      requests_per_unit: 100
      local: {unit: second, requests_per_unit: 50}
`

func mustRules(t *testing.T, y string) *descriptors.Config {
	t.Helper()
	f, err := descriptors.Parse("r.yaml", []byte(y))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := descriptors.New([]*descriptors.File{f}, descriptors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

var t0 = time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)

func TestValidate(t *testing.T) {
	t.Parallel()
	cfg := mustRules(t, rulesYAML)
	tests := []struct {
		name string
		o    override.Override
		want string // substring of the error; "" = valid
	}{
		{"scale a rule", override.Override{Domain: "edge", Rule: "edge.user_id", Kind: override.KindScale, Factor: 1.5, Reason: "r"}, ""},
		{"scale everything", override.Override{Kind: override.KindScale, Factor: 0.6, Reason: "r"}, ""},
		{"no reason", override.Override{Kind: override.KindScale, Factor: 2}, "a reason is required"},
		{"factor 0", override.Override{Kind: override.KindScale, Reason: "r"}, "scale factor must be above 0"},
		{"factor too large", override.Override{Kind: override.KindScale, Factor: 5000, Reason: "r"}, "at most 1000"},
		{"rule without domain", override.Override{Rule: "edge.user_id", Kind: override.KindShadow, Expires: t0, Reason: "r"}, "needs its domain"},
		{"unknown domain", override.Override{Domain: "nope", Kind: override.KindShadow, Expires: t0, Reason: "r"}, `domain "nope" has no rules`},
		{"unknown rule", override.Override{Domain: "edge", Rule: "edge.nope", Kind: override.KindShadow, Expires: t0, Reason: "r"}, `no rule "edge.nope"`},
		{"limit", override.Override{Domain: "edge", Rule: "edge.user_id", Kind: override.KindLimit, Limit: "100/5 minutes", Reason: "r"}, ""},
		{"limit without rule", override.Override{Domain: "edge", Kind: override.KindLimit, Limit: "1/second", Reason: "r"}, "limit needs a rule"},
		{"bad limit", override.Override{Domain: "edge", Rule: "edge.user_id", Kind: override.KindLimit, Limit: "10/fortnight", Reason: "r"}, `unknown unit "fortnight"`},
		{"block without value", override.Override{Domain: "edge", Kind: override.KindBlock, Reason: "r"}, "block needs a value"},
		{"bad value", override.Override{Domain: "edge", Value: "novalue", Kind: override.KindBlock, Reason: "r"}, "want key=value"},
		{"allow without expiry", override.Override{Domain: "edge", Kind: override.KindAllow, Reason: "r"}, "needs an expiry"},
		{"allow everything", override.Override{Kind: override.KindAllow, Expires: t0, Reason: "r"}, "allow needs a domain"},
		{"unknown kind", override.Override{Kind: "pause", Reason: "r"}, `unknown kind "pause"`},
		{"factor on a shadow", override.Override{Domain: "edge", Kind: override.KindShadow, Expires: t0, Factor: 2, Reason: "r"}, "factor is for scale only"},
		{"bypass protected", override.Override{Domain: "edge", Rule: "edge.login", Kind: override.KindAllow, Expires: t0, Reason: "r"}, "protected rule edge.login: cannot be bypassed"},
		{"scale protected up", override.Override{Domain: "edge", Rule: "edge.login", Kind: override.KindScale, Factor: 1.01, Reason: "r"}, "cannot be scaled above 1"},
		{"scale protected down", override.Override{Domain: "edge", Rule: "edge.login", Kind: override.KindScale, Factor: 0.5, Reason: "r"}, ""},
		{"raise protected", override.Override{Domain: "edge", Rule: "edge.login", Kind: override.KindLimit, Limit: "6/minute", Reason: "r"}, "cannot be given a higher limit"},
		{"lower protected", override.Override{Domain: "edge", Rule: "edge.login", Kind: override.KindLimit, Limit: "4/minute", Reason: "r"}, ""},
		{"shadow protected", override.Override{Domain: "edge", Rule: "edge.login", Kind: override.KindShadow, Expires: t0, Reason: "r"}, "protected rule edge.login: cannot be shadowed"},
		{"shadow a rule", override.Override{Domain: "edge", Rule: "edge.user_id", Kind: override.KindShadow, Expires: t0, Reason: "r"}, ""},
		{"shadow without expiry", override.Override{Domain: "edge", Kind: override.KindShadow, Reason: "r"}, "shadow needs an expiry"},
		{"shadow everything", override.Override{Kind: override.KindShadow, Expires: t0, Reason: "r"}, "shadow needs a domain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := override.Validate(tt.o, cfg)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Validate(%+v) = %v, want nil", tt.o, err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Validate(%+v) = %v, want an error with %q", tt.o, err, tt.want)
			}
		})
	}
}

func TestParseLimit(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in    string
		burst uint32
		want  bucket.Limit
		err   bool
	}{
		{"10/second", 0, bucket.Limit{Requests: 10, Period: time.Second, Burst: 10}, false},
		{"100/5 minutes", 0, bucket.Limit{Requests: 100, Period: 5 * time.Minute, Burst: 100}, false},
		{"3/hour", 9, bucket.Limit{Requests: 3, Period: time.Hour, Burst: 9}, false},
		{"0/second", 0, bucket.Limit{Requests: 0, Period: time.Second, Burst: 0}, false},
		{"ten/second", 0, bucket.Limit{}, true},
		{"10", 0, bucket.Limit{}, true},
		{"10/0 seconds", 0, bucket.Limit{}, true},
	} {
		got, err := override.ParseLimit(tt.in, tt.burst)
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("ParseLimit(%q, %d) = %+v, %v; want %+v, error %v", tt.in, tt.burst, got, err, tt.want, tt.err)
		}
	}
}

func TestCompile(t *testing.T) {
	t.Parallel()
	cfg := mustRules(t, rulesYAML)
	dom := cfg.Domain("edge")
	user := dom.Match([]descriptors.Entry{{Key: "user_id", Value: "a"}})
	login := dom.Match([]descriptors.Entry{{Key: "login", Value: "a"}})
	ip := dom.Match([]descriptors.Entry{{Key: "ip", Value: "a"}})
	ovs := []override.Override{
		{ID: "all", Kind: override.KindScale, Factor: 2, Reason: "r"},
		{ID: "ip", Domain: "edge", Rule: "edge.ip", Kind: override.KindLimit, Limit: "7/second", Reason: "r"},
		{ID: "worm", Domain: "edge", Value: "user_id=worm", Kind: override.KindBlock, Reason: "r"},
		{ID: "old", Domain: "edge", Kind: override.KindShadow, Reason: "r", Expires: t0},
	}
	tbl := override.Compile(cfg, ovs, t0)
	if got := len(tbl.Active()); got != 3 {
		t.Errorf("Active() has %d overrides, want 3 (the expired one dropped)", got)
	}
	e := tbl.Lookup("edge", user, []descriptors.Entry{{Key: "user_id", Value: "a"}})
	if e == nil || e.Global == nil || e.Global.Requests != 20 || e.Global.Burst != 40 || e.Shadow {
		t.Errorf("user_id under ×2: %+v, want global 20 burst 40, no shadow", e)
	}
	if e := tbl.Lookup("edge", user, []descriptors.Entry{{Key: "user_id", Value: "worm"}}); e == nil || !e.Block || e.Name != "override worm" {
		t.Errorf("user_id=worm: %+v, want blocked by override worm", e)
	}
	if e := tbl.Lookup("edge", nil, []descriptors.Entry{{Key: "user_id", Value: "worm"}}); e == nil || !e.Block {
		t.Errorf("user_id=worm without a rule: %+v, want blocked", e)
	}
	if e := tbl.Lookup("edge", login, []descriptors.Entry{{Key: "login", Value: "a"}}); e != nil {
		t.Errorf("protected login under ×2: %+v, want no effect", e)
	}
	if ig := tbl.Ignored(); len(ig) != 1 || !strings.Contains(ig[0], "override all: rule edge.login is protected") {
		t.Errorf("Ignored() = %q, want the ×2 on edge.login", ig)
	}
	// The set limit then the scale: 7 × 2 globally; the local 50 × 2.
	e = tbl.Lookup("edge", ip, []descriptors.Entry{{Key: "ip", Value: "a"}})
	if e == nil || e.Global.Requests != 14 || e.Local == nil || e.Local.Requests != 100 {
		t.Errorf("ip: %+v, want global 14, local 100", e)
	}
	if tbl.Count(override.KindScale) != 1 || tbl.Count(override.KindBlock) != 1 || tbl.Count(override.KindShadow) != 0 {
		t.Errorf("Count: scale %d block %d shadow %d, want 1 1 0", tbl.Count(override.KindScale), tbl.Count(override.KindBlock), tbl.Count(override.KindShadow))
	}
	if override.Compile(cfg, ovs[3:], t0) != nil {
		t.Error("Compile of expired overrides only: want nil")
	}
}

func TestScaleRounds(t *testing.T) {
	t.Parallel()
	cfg := mustRules(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 3}\n")
	r := cfg.Domain("d").Rules()[0]
	for _, tt := range []struct {
		f    float64
		want uint64
	}{{0.6, 2}, {0.01, 1}, {1.5, 5}, {1000, 3000}} {
		tbl := override.Compile(cfg, []override.Override{{Kind: override.KindScale, Factor: tt.f, Reason: "r"}}, t0)
		if e := tbl.Lookup("d", r, nil); e == nil || e.Global.Requests != tt.want {
			t.Errorf("3/second ×%v: %+v, want %d (never 0: a scale does not block)", tt.f, e, tt.want)
		}
	}
}

func TestManagerSetRemoveAudit(t *testing.T) {
	t.Parallel()
	cfg := mustRules(t, rulesYAML)
	store, err := override.OpenFile("")
	if err != nil {
		t.Fatal(err)
	}
	rec := &audittest.Recorder{}
	clock := clockwork.NewFakeClockAt(t0)
	m := override.NewManager(override.ManagerOptions{Store: store, Rules: func() *descriptors.Config { return cfg }, Clock: clock, Audit: rec, Node: "n1"})
	ctx := context.Background()
	o, err := m.Set(ctx, override.Override{Domain: "edge", Rule: "edge.user_id", Kind: override.KindScale, Factor: 1.5, Reason: "promo", Author: "mallory", Expires: t0.Add(time.Hour)}, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if o.Author != "alice" || o.ID == "" || !o.Created.Equal(t0) {
		t.Errorf("Set returned %+v, want author alice (not the client's claim), an ID, created at %v", o, t0)
	}
	// The same scope and kind replaces it: old → new in the audit.
	o2, err := m.Set(ctx, override.Override{Domain: "edge", Rule: "edge.user_id", Kind: override.KindScale, Factor: 2, Reason: "more", Expires: t0.Add(time.Hour)}, "alice")
	if err != nil || o2.ID != o.ID {
		t.Fatalf("second Set: %+v, %v; want the same ID %s", o2, err, o.ID)
	}
	if _, err := m.Remove(ctx, o.ID, "bob", "done"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Remove(ctx, o.ID, "bob", "again"); !errors.Is(err, override.ErrNotFound) {
		t.Errorf("Remove of a removed override: %v, want ErrNotFound", err)
	}
	want := []string{audit.KindOverrideSet, audit.KindApplied, audit.KindOverrideSet, audit.KindApplied, audit.KindOverrideRemove, audit.KindApplied}
	if got := kinds(rec.Events()); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("audit kinds %v, want %v", got, want)
	}
	second := rec.Events()[2]
	if second.Author != "alice" || second.Reason != "more" || second.Node != "n1" || len(second.Changes) != 1 ||
		second.Changes[0].Old != "scale ×1.5 until 2026-12-02T02:00:00Z" || second.Changes[0].New != "scale ×2 until 2026-12-02T02:00:00Z" {
		t.Errorf("second set's event %+v, want alice, more, n1, scale ×1.5 → ×2", second)
	}
	if _, err := m.Set(ctx, override.Override{Domain: "edge", Kind: override.KindAllow, Reason: "r", Expires: t0.Add(-time.Second)}, "alice"); err == nil {
		t.Error("Set with an expiry in the past: no error")
	}
}

// TestShadowSkipsProtected: a domain-wide shadow does not shadow the
// domain's protected rules (it used to: loosens ignored shadow).
func TestShadowSkipsProtected(t *testing.T) {
	t.Parallel()
	cfg := mustRules(t, rulesYAML)
	dom := cfg.Domain("edge")
	login := dom.Match([]descriptors.Entry{{Key: "login", Value: "a"}})
	user := dom.Match([]descriptors.Entry{{Key: "user_id", Value: "a"}})
	tbl := override.Compile(cfg, []override.Override{{ID: "sh", Domain: "edge", Kind: override.KindShadow, Expires: t0.Add(time.Hour), Reason: "r"}}, t0)
	if e := tbl.Lookup("edge", login, []descriptors.Entry{{Key: "login", Value: "a"}}); e != nil {
		t.Errorf("protected login under a domain shadow: %+v, want no effect", e)
	}
	if e := tbl.Lookup("edge", user, []descriptors.Entry{{Key: "user_id", Value: "a"}}); e == nil || !e.Shadow {
		t.Errorf("user_id under a domain shadow: %+v, want shadowed", e)
	}
	if ig := tbl.Ignored(); len(ig) != 1 || !strings.Contains(ig[0], "rule edge.login is protected: cannot be shadowed") {
		t.Errorf("Ignored() = %q, want the shadow on edge.login", ig)
	}
}

// TestManagerLoosenExpiry: an override that loosens the limits (allow,
// shadow, scale above 1, a higher limit) needs an expiry within
// MaxLoosenExpiry; tightening ones need none.
func TestManagerLoosenExpiry(t *testing.T) {
	t.Parallel()
	cfg := mustRules(t, rulesYAML)
	store, _ := override.OpenFile("")
	clock := clockwork.NewFakeClockAt(t0)
	m := override.NewManager(override.ManagerOptions{Store: store, Rules: func() *descriptors.Config { return cfg }, Clock: clock, MaxLoosenExpiry: 24 * time.Hour})
	ctx := context.Background()
	day, far := t0.Add(24*time.Hour), t0.Add(24*time.Hour+time.Second)
	for _, tt := range []struct {
		name string
		o    override.Override
		want string // "" = accepted
	}{
		{"allow in 2319", override.Override{Domain: "edge", Rule: "edge.user_id", Kind: override.KindAllow, Expires: time.Date(2319, 1, 1, 0, 0, 0, 0, time.UTC)}, "may expire at most 24h0m0s ahead"},
		{"allow a second too far", override.Override{Domain: "edge", Rule: "edge.user_id", Kind: override.KindAllow, Expires: far}, "--override-max-expiry"},
		{"allow a day", override.Override{Domain: "edge", Rule: "edge.user_id", Kind: override.KindAllow, Expires: day}, ""},
		{"shadow too far", override.Override{Domain: "edge", Kind: override.KindShadow, Expires: far}, "may expire at most"},
		{"shadow a day", override.Override{Domain: "edge", Kind: override.KindShadow, Expires: day}, ""},
		{"scale up forever", override.Override{Domain: "edge", Kind: override.KindScale, Factor: 2}, "needs an expiry"},
		{"scale up too far", override.Override{Domain: "edge", Kind: override.KindScale, Factor: 2, Expires: far}, "may expire at most"},
		{"scale down forever", override.Override{Domain: "edge", Kind: override.KindScale, Factor: 0.5}, ""},
		{"raise a limit forever", override.Override{Domain: "edge", Rule: "edge.user_id", Kind: override.KindLimit, Limit: "11/second", Burst: 20}, "needs an expiry"},
		{"raise a burst forever", override.Override{Domain: "edge", Rule: "edge.user_id", Kind: override.KindLimit, Limit: "10/second", Burst: 21}, "needs an expiry"},
		{"lower a limit forever", override.Override{Domain: "edge", Rule: "edge.user_id", Kind: override.KindLimit, Limit: "5/second"}, ""},
		{"block forever", override.Override{Domain: "edge", Value: "user_id=worm", Kind: override.KindBlock}, ""},
	} {
		tt.o.Reason = "r"
		_, err := m.Set(ctx, tt.o, "alice")
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: Set = %v, want accepted", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: Set = %v, want an error with %q", tt.name, err, tt.want)
		}
	}
}

// TestManagerExpiry: an expired override stops applying at its expiry on
// the clock; the node that deletes it records override.expire.
func TestManagerExpiry(t *testing.T) {
	t.Parallel()
	cfg := mustRules(t, rulesYAML)
	store, _ := override.OpenFile("")
	rec := &audittest.Recorder{}
	clock := clockwork.NewFakeClockAt(t0)
	m := override.NewManager(override.ManagerOptions{Store: store, Rules: func() *descriptors.Config { return cfg }, Clock: clock, Audit: rec, Resync: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := m.Set(ctx, override.Override{Domain: "edge", Kind: override.KindAllow, Reason: "sale", Expires: t0.Add(2 * time.Hour)}, "alice"); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }()
	defer func() { cancel(); <-done }()
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	if err := clock.BlockUntilContext(wctx, 1); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2*time.Hour - time.Nanosecond)
	if err := clock.BlockUntilContext(wctx, 1); err != nil {
		t.Fatal(err)
	}
	if m.Table(cfg) == nil {
		t.Fatal("dropped a nanosecond before its expiry")
	}
	clock.Advance(time.Nanosecond)
	if err := clock.BlockUntilContext(wctx, 1); err != nil {
		t.Fatal(err)
	}
	if m.Table(cfg) != nil {
		t.Fatal("still applied at its expiry")
	}
	if l, _ := store.List(ctx); len(l.Overrides) != 0 {
		t.Errorf("store still holds %v after the expiry", l)
	}
	if k := kinds(rec.Events()); k[len(k)-1] != audit.KindOverrideExpire && k[len(k)-2] != audit.KindOverrideExpire {
		t.Errorf("audit kinds %v, want an override.expire", k)
	}
}

// TestFileStoreSurvivesRestart: a FileStore's overrides are read back by
// the next process, and a file that does not decode is an error.
func TestFileStoreSurvivesRestart(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "overrides.json")
	s, err := override.OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	o := override.Override{ID: "x1", Domain: "edge", Kind: override.KindShadow, Reason: "r", Author: "a", Created: t0}
	if err := s.Put(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	again, err := override.OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := again.List(context.Background()); len(got.Overrides) != 1 || got.Overrides[0] != o {
		t.Errorf("after reopening: %v, want [%v]", got, o)
	}
	if err := os.WriteFile(path, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := override.OpenFile(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("OpenFile of a broken file: %v, want an error naming it", err)
	}
	// A write that fails changes nothing.
	bad, _ := override.OpenFile(filepath.Join(t.TempDir(), "missing-dir", "o.json"))
	if err := bad.Put(context.Background(), o); err == nil {
		t.Error("Put into a missing directory: no error")
	}
	if got, _ := bad.List(context.Background()); len(got.Overrides) != 0 {
		t.Errorf("after a failed Put: %v, want nothing stored", got)
	}
}

// TestManagerLogsIgnored: an override a protected rule refuses is logged.
func TestManagerLogsIgnored(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(&lockedWriter{&mu, &buf}, nil))
	cfg := mustRules(t, rulesYAML)
	store, _ := override.OpenFile("")
	m := override.NewManager(override.ManagerOptions{Store: store, Rules: func() *descriptors.Config { return cfg }, Logger: log})
	if _, err := m.Set(context.Background(), override.Override{Domain: "edge", Kind: override.KindScale, Factor: 2, Reason: "r", Expires: time.Now().Add(time.Hour)}, "a"); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(buf.String(), "rule edge.login is protected: cannot be scaled above 1") {
		t.Errorf("log %q, want the protected rule named", buf.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestManagerTableForReplacedRules: a request holding the rule set a
// reload replaced gets a table compiled for it, and the current rule set's
// table stays cached.
func TestManagerTableForReplacedRules(t *testing.T) {
	t.Parallel()
	oldCfg, newCfg := mustRules(t, rulesYAML), mustRules(t, rulesYAML)
	store, _ := override.OpenFile("")
	m := override.NewManager(override.ManagerOptions{Store: store, Rules: func() *descriptors.Config { return newCfg }})
	if _, err := m.Set(context.Background(), override.Override{Kind: override.KindScale, Factor: 2, Reason: "r", Expires: time.Now().Add(time.Hour)}, "a"); err != nil {
		t.Fatal(err)
	}
	cur := m.Table(newCfg)
	if cur == nil || cur.Rules() != newCfg {
		t.Fatalf("Table(current) = %v, want a table of the current rules", cur)
	}
	if old := m.Table(oldCfg); old == nil || old.Rules() != oldCfg {
		t.Errorf("Table(replaced rules) = %v, want a table compiled for them", old)
	}
	if again := m.Table(newCfg); again != cur {
		t.Error("the current rules' table was replaced by a request holding old rules")
	}
}

// kinds lists the events' kinds in order.
func kinds(events []audit.Event) []string {
	var k []string
	for _, e := range events {
		k = append(k, e.Kind)
	}
	return k
}
