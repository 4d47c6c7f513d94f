// Package buckettest is the conformance suite of the bucket contract: one
// table of scenarios that every bucket.Limiter must pass, whatever keeps its
// buckets. Run runs it against the Limiters a Harness builds:
// backend/memory on a fake clock, backend/redis on a real Redis and Redis
// Cluster, fallback.Limiter over a memory primary.
//
// Each scenario is a sequence of calls of Limiter.Hit on a fresh Limiter,
// some after moving its clock. Every call asserts the Decision (Allowed,
// and Answer Decided) and, for each hit, the State's Allowed, Remaining,
// RetryAfter and ResetAfter. Durations are exact for a Limiter on a fake
// clock; for one on a real clock the suite allows two things, explicitly:
// the time its decisions run behind the scenario (Subject.Now measures it),
// by which a duration may come out shorter, and Harness.Resolution, by
// which it may come out longer (backend/redis rounds microseconds up);
// for a Limiter that dates its store's answers at the call's start
// (Harness.DatesAtCall), the time its calls take adds to that lag.
// Remaining and the decisions are always exact: each scenario keeps its
// buckets at least its margin (its shortest token interval: 100ms where
// the clock moves, a minute or more elsewhere) from their next whole token,
// so a Limiter whose lag stays below the margin gives the very same
// answers. A run whose lag reached the margin proves nothing and is run
// again (Run).
//
// A scenario that changes a key's Limit to a slower rate stretches the lag:
// what a late Limiter saw refill at the old rate takes longer at the new
// one, so its durations may come out shorter by the lag times the ratio of
// the token intervals (the scenario's stretch).
//
// Where the backends answer differently, the suite asserts what they
// share: see the scenario comments, anyDuration and anyRemaining.
package buckettest

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rls/sluice/bucket"
)

// Harness builds the Limiters the suite runs against.
type Harness struct {
	// New returns the Subject of one scenario: a Limiter that has never
	// seen the scenario's keys (they are derived from t.Name(), so several
	// scenarios may share one store), on a clock of its own or a real one.
	New func(t *testing.T) Subject
	// Resolution is how much a Limiter may report a duration above its
	// exact value, by rounding up: 0 for nanosecond-exact backend/memory,
	// a microsecond for backend/redis (its script counts microseconds,
	// rounds up, and keeps the bucket's instant in a double).
	Resolution time.Duration
	// DatesAtCall says the Limiter dates what its store reports at the
	// start of its call, not when the store decided, which it cannot know
	// (backend/lease: its node's clock and Redis' may differ). Its
	// durations may then come out shorter by as much as the call took:
	// the suite adds the longest Hit so far to the lag.
	DatesAtCall bool
}

// Subject is one scenario's Limiter and its clock.
type Subject struct {
	Limiter bucket.Limiter
	// Advance moves the Limiter's time forward by d: at once for a fake
	// clock; for a Limiter on a clock no test can move (Redis' TIME), by
	// waiting d of real time.
	Advance func(d time.Duration)
	// Now reads the Limiter's time as the test sees it: the fake clock, or
	// time.Now for a real clock. The suite takes the time Now has run
	// beyond the scenario's advances as the lag by which the Limiter's
	// durations may come out short (always 0 on a fake clock).
	Now func() time.Time
}

// attempts bounds how often Run tries a scenario whose run was
// inconclusive (see Run).
const attempts = 3

// Run runs every scenario as a parallel subtest of t, and every bound
// scenario (alternation) as a subtest, one after the other.
//
// A mismatch fails the scenario when the Limiter's lag stayed below the
// scenario's margin (margin): then no lag can explain it. When the lag
// reached the margin (a real clock on an overloaded machine), the run
// proves nothing either way; Run logs it and runs the scenario again on a
// fresh Limiter with fresh keys, and fails it as inconclusive after
// attempts such runs. A Limiter on a fake clock has no lag, so its first
// mismatch fails.
func Run(t *testing.T, h Harness) {
	t.Helper()
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			m := sc.margin()
			for attempt := 1; ; attempt++ {
				errs, lag := runScenario(t, h, sc, attempt)
				switch {
				case len(errs) == 0:
					return
				case lag < m:
					for _, e := range errs {
						t.Error(e)
					}
					return
				case attempt == attempts:
					t.Fatalf("inconclusive: in each of %d runs the Limiter's clock lagged the scenario's by up to %v or more, not below the %v its assertions allow; the last run's mismatches:\n%s",
						attempts, lag, m, strings.Join(errs, "\n"))
				}
				t.Logf("run %d inconclusive: lag %v ≥ margin %v, %d mismatches (first: %s); again on a fresh Limiter", attempt, lag, m, len(errs), errs[0])
			}
		})
	}
	// Not parallel: they run before the scenarios start, so that their
	// many calls do not add to the lag of scenarios on a real clock.
	for _, a := range alternations {
		t.Run(a.name, func(t *testing.T) {
			runAlternation(t, h, a)
		})
	}
}

// margin is the lag below which a scenario's assertions are exact: the
// shortest token interval of its limits. Each scenario keeps its buckets a
// whole token interval from their next whole token, so a Limiter deciding
// less than that late reports the same tokens and decisions.
func (sc scenario) margin() time.Duration {
	m := time.Duration(math.MaxInt64)
	for _, c := range sc.calls {
		for _, h := range c.hits {
			if h.limit.Requests > 0 {
				m = min(m, h.limit.Period/time.Duration(h.limit.Requests))
			}
		}
	}
	return m
}

// runScenario runs sc once (attempt numbers its keys) and returns its
// mismatches and the largest lag of the Limiter's clock behind the
// scenario's (with Harness.DatesAtCall, plus the longest Hit). Errors of
// Hit, which no lag explains, fail t at once.
func runScenario(t *testing.T, h Harness, sc scenario, attempt int) (errs []string, lag time.Duration) {
	s := h.New(t)
	keys := map[int]bucket.Key{}
	keyOf := func(k int) bucket.Key {
		if _, ok := keys[k]; !ok {
			keys[k] = bucket.SumKey(fmt.Appendf(nil, "buckettest/%s/%d/%d", t.Name(), attempt, k))
		}
		return keys[k]
	}
	start := s.Now()
	var advanced, longest time.Duration
	for i, c := range sc.calls {
		if c.advance > 0 {
			s.Advance(c.advance)
			advanced += c.advance
		}
		hits := make([]bucket.Hit, len(c.hits))
		for j, ht := range c.hits {
			hits[j] = bucket.Hit{Key: keyOf(ht.key), Limit: ht.limit, Cost: ht.cost, Give: ht.give, Independent: ht.independent, Overdraw: ht.overdraw}
		}
		states := make([]bucket.State, len(hits))
		began := s.Now()
		d, err := s.Limiter.Hit(context.Background(), hits, states)
		if h.DatesAtCall {
			longest = max(longest, s.Now().Sub(began))
		}
		lag = max(s.Now().Sub(start)-advanced+longest, lag)
		where := fmt.Sprintf("call %d at +%v (%s)", i, advanced, describe(c.hits))
		if err != nil {
			t.Fatalf("%s: Hit: %v", where, err)
		}
		if d.Allowed != c.allowed || d.Answer != bucket.Decided {
			errs = append(errs, fmt.Sprintf("%s: Decision %+v, want Allowed %t, Answer Decided", where, d, c.allowed))
		}
		if len(c.states) != len(c.hits) {
			t.Fatalf("scenario %q call %d: %d states for %d hits", sc.name, i, len(c.states), len(c.hits))
		}
		short := lag * time.Duration(max(sc.stretch, 1))
		for j, want := range c.states {
			got := states[j]
			if got.Allowed != want.Allowed || !remainingOK(got.Remaining, want.Remaining) ||
				!durationOK(got.RetryAfter, want.RetryAfter, short, h.Resolution) ||
				!durationOK(got.ResetAfter, want.ResetAfter, short, h.Resolution) {
				errs = append(errs, fmt.Sprintf("%s: hit %d: got %s, want %s (durations within -%v/+%v)", where, j, show(got), show(want), short, h.Resolution))
			}
		}
	}
	return errs, lag
}

// anyDuration in a wanted State leaves that duration unasserted, and
// anyRemaining its Remaining: where the backends disagree (see "Requests 0"
// and the scenarios of a key hit twice in one call).
const (
	anyDuration  = time.Duration(-1)
	anyRemaining = uint64(math.MaxUint64)
)

// remainingOK reports whether got may be the Remaining want: exactly, as
// the scenarios keep their buckets clear of a token's edge (Run).
func remainingOK(got, want uint64) bool {
	return want == anyRemaining || got == want
}

// durationOK reports whether got may be the duration want of a Limiter that
// decided up to lag later than the scenario says and rounds up to res.
func durationOK(got, want, lag, res time.Duration) bool {
	if want == anyDuration {
		return true
	}
	return got >= want-lag && got <= want+res
}

func show(s bucket.State) string {
	verdict := "refused"
	if s.Allowed {
		verdict = "allowed"
	}
	d := func(x time.Duration) string {
		if x == anyDuration {
			return "any"
		}
		return x.String()
	}
	r := fmt.Sprint(s.Remaining)
	if s.Remaining == anyRemaining {
		r = "any"
	}
	return fmt.Sprintf("%s, Remaining %s, RetryAfter %s, ResetAfter %s", verdict, r, d(s.RetryAfter), d(s.ResetAfter))
}

func describe(hits []hit) string {
	if len(hits) == 0 {
		return "no hits"
	}
	parts := make([]string, len(hits))
	for i, h := range hits {
		op := "take"
		switch {
		case h.give:
			op = "give"
		case h.cost == 0:
			op = "check"
		}
		switch {
		case h.overdraw:
			op = "charge (overdraw)"
		case h.independent:
			op = "independent " + op
		}
		parts[i] = fmt.Sprintf("%s %d of key %d (%d per %v, burst %d)", op, h.cost, h.key, h.limit.Requests, h.limit.Period, h.limit.Burst)
	}
	return strings.Join(parts, "; ")
}
