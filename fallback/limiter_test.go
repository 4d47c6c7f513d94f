package fallback_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"go.uber.org/goleak"

	"github.com/sluice-rls/sluice/backend/memory"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/fallback"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var errDown = errors.New("redis down")

// primary is a Redis stand-in: memory buckets reported as shared, failing
// while down is set.
type primary struct {
	mem   *memory.Limiter
	down  atomic.Bool
	slow  atomic.Bool // calls time out
	calls atomic.Int64
}

// errTimeout is a call that missed its deadline (backend/redis wraps
// context.DeadlineExceeded).
var errTimeout = fmt.Errorf("token_bucket.lua: %w", context.DeadlineExceeded)

func (p *primary) Hit(ctx context.Context, hits []bucket.Hit, states []bucket.State) (bucket.Decision, error) {
	p.calls.Add(1)
	if p.down.Load() {
		return bucket.Decision{}, errDown
	}
	if p.slow.Load() {
		return bucket.Decision{}, errTimeout
	}
	return p.mem.Hit(ctx, hits, states)
}

func (p *primary) Shared() bool { return true }

// rig is a switch over a primary, on a fake clock, whose probe reports
// each call on probes and answers from up; while hang is set it waits for
// its deadline instead (a stalled Redis).
type rig struct {
	sw     *fallback.Limiter
	p      *primary
	clock  *clockwork.FakeClock
	up     atomic.Bool
	hang   atomic.Bool
	probes chan struct{}
}

func newRig(t *testing.T, mode fallback.Mode, opts ...func(*fallback.Options)) *rig {
	t.Helper()
	r := &rig{p: &primary{mem: memory.New(memory.Options{})}, clock: clockwork.NewFakeClock(), probes: make(chan struct{}, 16)}
	o := fallback.Options{
		Primary: r.p,
		Share:   memory.New(memory.Options{}),
		Probe: func(ctx context.Context) error {
			r.probes <- struct{}{}
			if r.hang.Load() {
				<-ctx.Done()
				return ctx.Err()
			}
			if r.up.Load() {
				return nil
			}
			return errDown
		},
		Nodes: func() int { return 1 },
		Mode:  mode,
		Clock: r.clock,
	}
	for _, f := range opts {
		f(&o)
	}
	r.sw = fallback.New(o)
	t.Cleanup(r.sw.Close)
	return r
}

var take = []bucket.Hit{{Key: bucket.Key{1}, Limit: bucket.Limit{Requests: 1, Period: time.Hour, Burst: 1}, Cost: 1}}

func (r *rig) hit(t *testing.T) bucket.Decision {
	t.Helper()
	d, err := r.sw.Hit(context.Background(), take, make([]bucket.State, len(take)))
	if err != nil {
		t.Fatalf("Hit: %v", err)
	}
	return d
}

// TestAnswers: each failure mode says who answered, through the Decision
// alone.
func TestAnswers(t *testing.T) {
	for _, tt := range []struct {
		mode    fallback.Mode
		want    bucket.Answer
		allowed bool
	}{
		{fallback.Share, bucket.Fallback, false}, // its one token spent through Redis
		{fallback.Local, bucket.Skipped, true},
		{fallback.Allow, bucket.Bypassed, true},
		{fallback.Deny, bucket.Fallback, false},
	} {
		t.Run(tt.mode.String(), func(t *testing.T) {
			r := newRig(t, tt.mode)
			if d := r.hit(t); d != (bucket.Decision{Allowed: true, Answer: bucket.Decided}) {
				t.Fatalf("Redis up: %+v, want allowed and Decided", d)
			}
			r.p.down.Store(true)
			if d := r.hit(t); d.Answer != tt.want || d.Allowed != tt.allowed {
				t.Errorf("Redis down: %+v, want Answer %v, Allowed %v", d, tt.want, tt.allowed)
			}
			if !r.sw.Active() || r.sw.State() != "fallback ("+tt.mode.String()+")" {
				t.Errorf("Active %v, State %q", r.sw.Active(), r.sw.State())
			}
		})
	}
}

// TestGuardLocal: in the Allow mode the local layer is bypassed while the
// switch is active, and only then; other modes leave it alone.
func TestGuardLocal(t *testing.T) {
	local := memory.New(memory.Options{})
	if g := newRig(t, fallback.Share).sw.GuardLocal(local); g != bucket.Limiter(local) {
		t.Errorf("Share mode wrapped the local layer")
	}
	r := newRig(t, fallback.Allow)
	g := r.sw.GuardLocal(local)
	states := make([]bucket.State, 1)
	if d, _ := g.Hit(context.Background(), take, states); d.Answer != bucket.Decided || !d.Allowed {
		t.Fatalf("Redis up: local answered %+v, want Decided", d)
	}
	if d, _ := g.Hit(context.Background(), take, states); d.Answer != bucket.Decided || d.Allowed {
		t.Fatalf("Redis up, bucket empty: local answered %+v, want refused", d)
	}
	r.p.down.Store(true)
	r.hit(t)
	if d, _ := g.Hit(context.Background(), take, states); d.Answer != bucket.Bypassed || !d.Allowed {
		t.Errorf("in fallback: local answered %+v, want Bypassed", d)
	}
	if g.Shared() {
		t.Errorf("the guarded memory layer reports shared buckets")
	}
}

// TestProbeBacksOffOnTheClock: the probe runs on the injected clock — first
// after 50ms, then after doubling waits — and switches back once the
// primary answers; no request reaches the primary meanwhile.
func TestProbeBacksOffOnTheClock(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := newRig(t, fallback.Share)
	r.p.down.Store(true)
	r.hit(t)
	for i, wait := range []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond} {
		if err := r.clock.BlockUntilContext(ctx, 1); err != nil {
			t.Fatalf("probe %d never waited: %v", i+1, err)
		}
		r.clock.Advance(wait - time.Millisecond)
		select {
		case <-r.probes:
			t.Fatalf("probe %d ran before its %v wait", i+1, wait)
		default:
		}
		if i == 2 {
			r.up.Store(true)
			r.p.down.Store(false)
		}
		r.clock.Advance(time.Millisecond)
		select {
		case <-r.probes:
		case <-ctx.Done():
			t.Fatalf("probe %d did not run after %v", i+1, wait)
		}
	}
	r.sw.Close() // waits for the probe goroutine, which has switched back
	if r.sw.Active() {
		t.Fatal("still in fallback after a probe succeeded")
	}
	if d := r.hit(t); d.Answer != bucket.Decided {
		t.Errorf("after recovery: %+v, want Decided by the primary", d)
	}
}

func TestModeText(t *testing.T) {
	for _, s := range []string{"share", "local", "allow", "deny"} {
		var m fallback.Mode
		if err := m.UnmarshalText([]byte(s)); err != nil || m.String() != s {
			t.Errorf("UnmarshalText(%q) = %v, %v", s, m, err)
		}
	}
	var m fallback.Mode
	if err := m.UnmarshalText([]byte("open")); err == nil {
		t.Error("UnmarshalText(open) accepted")
	}
}
