package share_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/sluice-rls/sluice/backend/memory"
	"github.com/sluice-rls/sluice/backend/share"
	"github.com/sluice-rls/sluice/bucket"
)

// shareRule is a hit's rule with a share in millionths; 0 sets none (the
// layer's Default).
type shareRule uint32

func (r shareRule) ShareMillionths(def uint32) uint32 {
	if r == 0 {
		return def
	}
	return uint32(r)
}

// members is a Membership a test sets.
type members struct {
	mu sync.Mutex
	n  int
	ok bool
}

func (m *members) ShareAt(time.Time) (int, bool) { return m.Share() }

func (m *members) Share() (int, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.n, m.ok
}

func (m *members) set(n int, ok bool) {
	m.mu.Lock()
	m.n, m.ok = n, ok
	m.mu.Unlock()
}

// recording is the layer behind: it records every call and decides on
// its Limiter, or fails with err when set.
type recording struct {
	bucket.Limiter
	mu    sync.Mutex
	calls [][]bucket.Hit
	err   error
}

func (r *recording) Hit(ctx context.Context, hits []bucket.Hit, states []bucket.State) (bucket.Decision, error) {
	r.mu.Lock()
	r.calls = append(r.calls, append([]bucket.Hit(nil), hits...))
	err := r.err
	r.mu.Unlock()
	if err != nil {
		return bucket.Decision{}, err
	}
	return r.Limiter.Hit(ctx, hits, states)
}

func (r *recording) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.calls)
}

func (r *recording) last(t *testing.T) []bucket.Hit {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.calls) == 0 {
		t.Fatal("the layer behind was never called")
	}
	return r.calls[len(r.calls)-1]
}

var errBehind = errors.New("behind failed")

// fixture is a share layer over a memory layer behind, on one fake clock.
type fixture struct {
	clock  *clockwork.FakeClock
	behind *recording
	member *members
	l      *share.Limiter
}

func newFixture(t *testing.T, n int, maxBuckets int) *fixture {
	t.Helper()
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	f := &fixture{
		clock:  clock,
		behind: &recording{Limiter: memory.New(memory.Options{Clock: clock})},
		member: &members{n: n, ok: true},
	}
	f.l = share.New(share.Options{Inner: f.behind, Membership: f.member, Clock: clock, MaxBuckets: maxBuckets})
	f.held(f.l)
	return f
}

// held lets l see the share its membership gives (with a check, which
// goes behind), then lets every cell refill for an hour, and forgets the
// calls behind: l's cells start full.
func (f *fixture) held(l *share.Limiter) {
	check := []bucket.Hit{{Key: key("held"), Limit: bucket.Limit{Requests: 1, Period: time.Second, Burst: 1}, Rule: shareRule(500_000)}}
	_, _ = l.Hit(context.Background(), check, make([]bucket.State, 1))
	f.clock.Advance(time.Hour)
	f.behind.mu.Lock()
	f.behind.calls = nil
	f.behind.mu.Unlock()
}

// hit decides hits and fails t on an error.
func (f *fixture) hit(t *testing.T, hits ...bucket.Hit) (bucket.Decision, []bucket.State) {
	t.Helper()
	states := make([]bucket.State, len(hits))
	d, err := f.l.Hit(context.Background(), hits, states)
	if err != nil {
		t.Fatalf("Hit: %v", err)
	}
	return d, states
}

func key(s string) bucket.Key { return bucket.SumKey([]byte(s)) }
