package lease

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/sluice-rls/sluice/bucket"
)

// A pool closed before its end leaves a stale end in the heap: when it
// pops, the key's next pool, started since, stays until its own end.
func TestStaleEndKeepsNextPool(t *testing.T) {
	r := startRedis(t, "ends")
	clock := clockwork.NewFakeClock()
	l := New(Options{Leaser: r, Clock: clock, Period: time.Second, EagerLeases: true})
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	ctx := context.Background()
	k := bucket.SumKey([]byte("stale"))
	lim := bucket.Limit{Requests: 1000, Period: time.Second, Burst: 1000}
	states := make([]bucket.State, 1)
	take := func(cost uint64) {
		t.Helper()
		if d, err := l.Hit(ctx, []bucket.Hit{{Key: k, Limit: lim, Cost: cost}}, states); err != nil || !d.Allowed {
			t.Fatalf("take of %d: %v %v", cost, d, err)
		}
	}
	pool := func() (time.Time, uint64) {
		l.mu.Lock()
		defer l.mu.Unlock()
		e := l.entries[k]
		if e == nil || e.granted == 0 {
			return time.Time{}, 0
		}
		return e.expires, e.held
	}
	take(1) // the first pool, ending at 1 s
	first, held := pool()
	if held == 0 {
		t.Fatal("the first take leased nothing")
	}
	clock.Advance(500 * time.Millisecond)
	take(held + 1) // more than the pool holds: Redis closes it, and leases the next
	second, held := pool()
	if held == 0 || !second.After(first) {
		t.Fatalf("after a take beyond the pool: pool ending %v holding %d, want a new pool ending after %v", second, held, first)
	}
	clock.Advance(600 * time.Millisecond) // past the first pool's end
	if err := l.step(ctx, stepTick); err != nil {
		t.Fatal(err)
	}
	if end, h := pool(); !end.Equal(second) || h != held {
		t.Errorf("after the first pool's end: pool ending %v holding %d, want the second, ending %v holding %d", end, h, second, held)
	}
	clock.Advance(500 * time.Millisecond) // past the second's
	if err := l.step(ctx, stepTick); err != nil {
		t.Fatal(err)
	}
	if end, h := pool(); h != 0 || !end.IsZero() {
		t.Errorf("after the second pool's end: pool ending %v holding %d, want none", end, h)
	}
	if len(l.ends) != 0 {
		t.Errorf("%d ends left in the heap after every pool ended, want 0", len(l.ends))
	}
}
