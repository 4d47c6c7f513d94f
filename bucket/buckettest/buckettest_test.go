package buckettest

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/sluice-rls/sluice/backend/memory"
	"github.com/sluice-rls/sluice/bucket"
)

// TestDurationOK pins the only slack the suite gives durations: none on a
// fake clock; on a real one, the measured lag below and the resolution
// above.
func TestDurationOK(t *testing.T) {
	const want = time.Minute
	tests := []struct {
		name     string
		got      time.Duration
		lag, res time.Duration
		ok       bool
	}{
		{"exact", want, 0, 0, true},
		{"a nanosecond short, no lag", want - 1, 0, 0, false},
		{"a nanosecond long, no resolution", want + 1, 0, 0, false},
		{"short by the lag", want - time.Millisecond, time.Millisecond, 0, true},
		{"short by more than the lag", want - time.Millisecond - 1, time.Millisecond, 0, false},
		{"rounded up by the resolution", want + time.Microsecond, 0, time.Microsecond, true},
		{"long by more than the resolution", want + time.Microsecond + 1, 0, time.Microsecond, false},
		{"lag never lengthens", want + 1, time.Second, 0, false},
	}
	for _, tt := range tests {
		if got := durationOK(tt.got, want, tt.lag, tt.res); got != tt.ok {
			t.Errorf("%s: durationOK(%v, %v, lag %v, res %v) = %t, want %t", tt.name, tt.got, want, tt.lag, tt.res, got, tt.ok)
		}
	}
	if !durationOK(42*time.Hour, anyDuration, 0, 0) {
		t.Errorf("anyDuration did not accept an arbitrary duration")
	}
}

// TestRemainingOK pins that Remaining is exact unless a scenario leaves it
// unasserted.
func TestRemainingOK(t *testing.T) {
	if !remainingOK(3, 3) || remainingOK(2, 3) || remainingOK(4, 3) {
		t.Errorf("remainingOK is not exact")
	}
	if !remainingOK(0, anyRemaining) || !remainingOK(7, anyRemaining) {
		t.Errorf("anyRemaining did not accept an arbitrary Remaining")
	}
}

// TestScenarioTable checks the table itself: unique names, one wanted state
// per hit, and a scenario for each rule of the contract.
func TestScenarioTable(t *testing.T) {
	seen := map[string]bool{}
	for _, sc := range scenarios {
		if seen[sc.name] {
			t.Errorf("scenario %q appears twice", sc.name)
		}
		seen[sc.name] = true
		if len(sc.calls) == 0 {
			t.Errorf("scenario %q has no calls", sc.name)
		}
		for i, c := range sc.calls {
			if len(c.states) != len(c.hits) {
				t.Errorf("scenario %q call %d: %d states for %d hits", sc.name, i, len(c.states), len(c.hits))
			}
		}
	}
	for _, name := range []string{
		"take", "all-or-nothing refusal", "gives on an allowed call", "gives on a refused call",
		"check only", "independent hits", "cost above burst", "Requests 0", "refill over time",
		"same key twice in one call", "same key: a give does not help a take of the same call",
		"same key: an independent hit does not block a later take",
		"same key: a give before a take returns the take's tokens",
		"limit raised: spent stays spent", "limit lowered: refused until the excess refills, spent stays spent",
		"limit lowered: the bucket refills at the new rate", "limit changed: a fraction of a token converts",
		"burst raised alone: spent stays spent", "burst lowered alone: spent stays spent",
		"disagreeing limits: the smaller limit forgives nothing",
		"period changed: spent stays spent, refilling at the new rate",
	} {
		if !seen[name] {
			t.Errorf("no scenario %q", name)
		}
	}
}

// TestMargin pins the lag a real clock may have in the scenario that moves
// the clock, and in one that does not.
func TestMargin(t *testing.T) {
	want := map[string]time.Duration{"refill over time": 100 * time.Millisecond, "take": time.Minute, "limit raised: spent stays spent": 6 * time.Hour,
		"limit lowered: the bucket refills at the new rate": 100 * time.Millisecond}
	for _, sc := range scenarios {
		if w, ok := want[sc.name]; ok {
			if got := sc.margin(); got != w {
				t.Errorf("%q: margin %v, want %v", sc.name, got, w)
			}
			delete(want, sc.name)
		}
	}
	if len(want) > 0 {
		t.Errorf("no scenarios %v", want)
	}
}

// TestDatesAtCall pins the lag of a Limiter that dates its store's answers
// at the start of its calls (backend/lease): one whose third call took
// 8ms to reach its store answers the calls after it 8ms short, beyond the
// 8ms its clock then runs behind the scenario. The suite must count the
// call's time only when told (Harness.DatesAtCall).
func TestDatesAtCall(t *testing.T) {
	var sc scenario
	for _, s := range scenarios {
		if s.name == "refill over time" {
			sc = s
		}
	}
	const slow = 8 * time.Millisecond
	for _, dates := range []bool{false, true} {
		h := Harness{DatesAtCall: dates, New: func(t *testing.T) Subject {
			clock := clockwork.NewFakeClock()
			l := &datedAtCall{inner: memory.New(memory.Options{Clock: clock}), clock: clock, slowCall: 2, slow: slow}
			return Subject{Limiter: l, Advance: clock.Advance, Now: clock.Now}
		}}
		errs, lag := runScenario(t, h, sc, 1)
		if dates && (len(errs) > 0 || lag != 2*slow) {
			t.Errorf("DatesAtCall: lag %v (want %v), mismatches %q", lag, 2*slow, errs)
		}
		if !dates && (len(errs) == 0 || lag != slow) {
			t.Errorf("without DatesAtCall: lag %v (want %v), mismatches %q (want some)", lag, slow, errs)
		}
	}
}

// datedAtCall is a Limiter whose call number slowCall reaches its store
// (inner) slow late on its clock, and which dates the states of the later
// calls at that call's start, as backend/lease dates a reply at its send.
type datedAtCall struct {
	inner           bucket.Limiter
	clock           *clockwork.FakeClock
	calls, slowCall int
	slow, early     time.Duration
}

func (d *datedAtCall) Hit(ctx context.Context, hits []bucket.Hit, states []bucket.State) (bucket.Decision, error) {
	early := d.early
	if d.calls == d.slowCall {
		d.clock.Advance(d.slow)
		d.early = d.slow
	}
	d.calls++
	dec, err := d.inner.Hit(ctx, hits, states)
	for i := range states[:len(hits)] {
		states[i].RetryAfter = max(states[i].RetryAfter-early, 0)
		states[i].ResetAfter = max(states[i].ResetAfter-early, 0)
	}
	return dec, err
}

func (d *datedAtCall) Shared() bool { return false }

// TestAlternations checks the bound scenarios' table and arithmetic: two
// distinct limits each, and the bound the largest burst plus the largest
// rate times the run's time, rounded down.
func TestAlternations(t *testing.T) {
	if len(alternations) == 0 {
		t.Fatal("no alternations")
	}
	for _, a := range alternations {
		if a.limits[0] == a.limits[1] || a.rounds < 1 || a.takes < 2 {
			t.Errorf("%q: limits %+v, %d rounds of %d takes: want two limits that differ, alternated", a.name, a.limits, a.rounds, a.takes)
		}
	}
	a := alternation{limits: [2]bucket.Limit{
		{Requests: 20, Period: time.Second, Burst: 10},
		{Requests: 10, Period: time.Second, Burst: 50},
	}}
	for _, tt := range []struct {
		d           time.Duration
		most, least uint64
	}{
		{0, 50, 10},
		{49 * time.Millisecond, 50, 10}, // 0.98 of a token at 20/s
		{50 * time.Millisecond, 51, 10},
		{time.Second, 70, 10},
	} {
		if most, least := a.bound(tt.d); most != tt.most || least != tt.least {
			t.Errorf("bound(%v) = %d, %d; want %d, %d", tt.d, most, least, tt.most, tt.least)
		}
	}
}
