package lease

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/sluice-rls/sluice/bucket"
)

// With Autostart, Run starts at the first leased hit, not before: hits of
// exact rules leave the node without a lease loop, and a hit of a rule
// that became leased (a reload) starts it, which then prefetches. Close
// stops it (TestMain's leak check), and a Limiter closed first never
// starts it.
func TestAutostart(t *testing.T) {
	r := startRedis(t, "autostart")
	newL := func() *Limiter {
		l := New(Options{Leaser: r, Exact: r, Default: Exact, Clock: clockwork.NewFakeClock(), Period: time.Hour, EagerLeases: true, Autostart: true})
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		return l
	}
	ctx := context.Background()
	lim := bucket.Limit{Requests: 1000, Period: time.Hour, Burst: 1000}
	k := bucket.SumKey([]byte("autostart"))
	hit := func(l *Limiter, h bucket.Hit) {
		t.Helper()
		if d, err := l.Hit(ctx, []bucket.Hit{h}, make([]bucket.State, 1)); err != nil || !d.Allowed {
			t.Fatalf("%+v: %+v %v", h, d, err)
		}
	}

	l := newL()
	for range 3 {
		hit(l, bucket.Hit{Key: bucket.SumKey([]byte("exact")), Limit: lim, Cost: 1})
	}
	if l.started.Load() {
		t.Fatal("Run started by hits of exact rules")
	}
	hit(l, bucket.Hit{Key: k, Limit: lim, Cost: 1, Rule: leasedRule{}}) // leases 499
	if !l.started.Load() {
		t.Fatal("Run not started by a leased hit")
	}
	hit(l, bucket.Hit{Key: k, Limit: lim, Cost: 250, Rule: leasedRule{}})
	held := func() uint64 {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.entries[k].held
	}
	// Below half of its lease: Run's prefetch adds half of Redis' 500.
	for deadline := time.Now().Add(10 * time.Second); held() != 499; {
		if time.Now().After(deadline) {
			t.Fatalf("the node holds %d tokens of the key, want 249 + a prefetch of 250 by Run", held())
		}
		time.Sleep(time.Millisecond)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}

	closed := newL()
	if err := closed.Close(ctx); err != nil {
		t.Fatal(err)
	}
	hit(closed, bucket.Hit{Key: bucket.SumKey([]byte("closed")), Limit: lim, Cost: 1, Rule: leasedRule{}})
	if closed.started.Load() {
		t.Error("Run started after Close")
	}
}

// leasedRule is a hit's rule that says leased.
type leasedRule struct{}

func (leasedRule) Leased(bool) bool { return true }
