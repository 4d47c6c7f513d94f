package buckettest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-rls/sluice/bucket"
)

// alternation is a bound scenario: takes of one token on one key, each
// under the other of two Limits in turn, as calls spread over nodes that
// run different limits for one rule do (during a rollout, an xDS update,
// or with different overrides). Whatever the Limits, what the Limiter
// admits over the whole run is bounded by what the most generous of them
// allows: the largest burst plus the largest rate times the time the run
// took. Unlike a scenario, it asserts that bound, not each call's state.
type alternation struct {
	name   string
	limits [2]bucket.Limit
	rounds int           // rounds of takes
	step   time.Duration // the clock moves this much before each round but the first
	takes  int           // takes per round, alternating between the limits
}

var alternations = []alternation{
	{
		// Each switch from the larger burst to the smaller once forgave
		// the difference: 34 of 60 takes admitted, 19 of 30.
		name:   "disagreeing limits alternate: burst 10 and 9",
		limits: [2]bucket.Limit{perMinute, {Requests: 10, Period: 10 * time.Minute, Burst: 9}},
		rounds: 1,
		takes:  30,
	},
	{
		// 20/s burst 10 against 10/s burst 5, the clock moving: each
		// round refills 2 tokens at the faster rate. Clamping admitted
		// 62 of 120 takes in 4 rounds of 30 (bound 16), 32 of 60 in 3
		// rounds of 20 (bound 14).
		name: "disagreeing limits alternate: rate and burst halved, the clock moving",
		limits: [2]bucket.Limit{
			{Requests: 20, Period: time.Second, Burst: 10},
			{Requests: 10, Period: time.Second, Burst: 5},
		},
		rounds: 3,
		step:   100 * time.Millisecond,
		takes:  20,
	},
}

// bound returns the most a Limiter may admit under a's limits over a run
// of length d: the largest burst plus the largest rate times d (rounded
// down: a token refills whole), and the least it must admit (the smaller
// burst, which the first round alone may take).
func (a alternation) bound(d time.Duration) (most, least uint64) {
	var rate float64 // tokens per nanosecond
	least = a.limits[0].Burst
	for _, l := range a.limits {
		most = max(most, l.Burst)
		least = min(least, l.Burst)
		rate = max(rate, float64(l.Requests)/float64(l.Period))
	}
	return most + uint64(rate*float64(d)), least
}

// runAlternation runs a on a fresh Limiter and fails t when it admitted
// more than the bound over the time the run took as Subject.Now measures
// it (on a real clock, all of it: every decision of the run falls within
// it), or less than the smaller burst.
func runAlternation(t *testing.T, h Harness, a alternation) {
	s := h.New(t)
	k := bucket.SumKey(fmt.Appendf(nil, "buckettest/%s", t.Name()))
	start := s.Now()
	var admitted uint64
	states := make([]bucket.State, 1)
	for r := range a.rounds {
		if r > 0 {
			s.Advance(a.step)
		}
		for i := range a.takes {
			hits := []bucket.Hit{{Key: k, Limit: a.limits[i%2], Cost: 1}}
			d, err := s.Limiter.Hit(context.Background(), hits, states)
			if err != nil {
				t.Fatalf("round %d take %d: Hit: %v", r, i, err)
			}
			if d.Allowed {
				admitted++
			}
		}
	}
	took := s.Now().Sub(start)
	most, least := a.bound(took)
	if admitted > most {
		t.Errorf("admitted %d of %d takes alternating %+v and %+v over %v, more than the %d the most generous limit allows (largest burst + largest rate × %v)",
			admitted, a.rounds*a.takes, a.limits[0], a.limits[1], took, most, took)
	}
	if admitted < least {
		t.Errorf("admitted %d of %d takes alternating %+v and %+v, fewer than the smaller burst %d", admitted, a.rounds*a.takes, a.limits[0], a.limits[1], least)
	}
	t.Logf("admitted %d of %d takes over %v (bound %d)", admitted, a.rounds*a.takes, took, most)
}
