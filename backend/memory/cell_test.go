package memory

import (
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-rls/sluice/bucket"
)

const year = 365 * 24 * time.Hour

// applyCell is apply on a whole cell, as the Limiter uses it: the bucket
// read under lim (converted when written under another Limit), and the
// result recorded under lim.
func applyCell(b cell, lim bucket.Limit, now int64, cost uint64, give bool) (cell, bucket.State, bool) {
	g, st, changed := apply(b.view(now, lim), lim, now, cost, give, false)
	return cell{gcra: g, lim: lim}, st, changed
}

// bucketStep is one hit in a bucketScenario.
type bucketStep struct {
	at    time.Duration // since the scenario's start; never decreases
	cost  uint64
	give  bool
	times int // repeat the hit this many times (0 means once); each must be allowed as want says, and the last must match want
	want  bucket.State
}

// bucketScenario is a sequence of hits on one fresh bucket and the state
// each must report. The table speaks only of the contract (bucket.Hit
// and bucket.State), not of this package's representation, so that any
// backend can run it: runScenario takes the backend as a function.
type bucketScenario struct {
	name  string
	limit bucket.Limit
	steps []bucketStep
}

// ok and refused build expected states.
func ok(remaining uint64, reset time.Duration) bucket.State {
	return bucket.State{Allowed: true, Remaining: remaining, ResetAfter: reset}
}

func refused(remaining uint64, retry, reset time.Duration) bucket.State {
	return bucket.State{Remaining: remaining, RetryAfter: retry, ResetAfter: reset}
}

// bucketScenarios is the one table of token-bucket behaviour.
var bucketScenarios = []bucketScenario{
	{
		name:  "new bucket starts full",
		limit: bucket.Limit{Requests: 10, Period: time.Second, Burst: 10},
		steps: []bucketStep{{at: 0, cost: 0, want: ok(10, 0)}},
	},
	{
		name:  "burst then one token per 100ms",
		limit: bucket.Limit{Requests: 10, Period: time.Second, Burst: 10},
		steps: []bucketStep{
			{at: 0, cost: 1, want: ok(9, 100*time.Millisecond)},
			{at: 0, cost: 1, times: 9, want: ok(0, time.Second)},
			{at: 0, cost: 1, want: refused(0, 100*time.Millisecond, time.Second)},
			{at: 99 * time.Millisecond, cost: 1, want: refused(0, time.Millisecond, 901*time.Millisecond)},
			{at: 100 * time.Millisecond, cost: 1, want: ok(0, time.Second)},
			{at: 150 * time.Millisecond, cost: 1, want: refused(0, 50*time.Millisecond, 950*time.Millisecond)},
			{at: 650 * time.Millisecond, cost: 0, want: ok(5, 450*time.Millisecond)},
			{at: 1100 * time.Millisecond, cost: 0, want: ok(10, 0)},
			{at: 5 * time.Second, cost: 1, times: 10, want: ok(0, time.Second)},
		},
	},
	{
		name:  "burst larger than rate",
		limit: bucket.Limit{Requests: 1, Period: time.Second, Burst: 5},
		steps: []bucketStep{
			{at: 0, cost: 1, times: 5, want: ok(0, 5*time.Second)},
			{at: 2500 * time.Millisecond, cost: 0, want: ok(2, 2500*time.Millisecond)},
			{at: 10 * time.Second, cost: 0, want: ok(5, 0)},
		},
	},
	{
		name:  "cost above one",
		limit: bucket.Limit{Requests: 10, Period: time.Second, Burst: 10},
		steps: []bucketStep{
			{at: 0, cost: 4, want: ok(6, 400*time.Millisecond)},
			{at: 0, cost: 7, want: refused(6, 100*time.Millisecond, 400*time.Millisecond)},
			{at: 100 * time.Millisecond, cost: 7, want: ok(0, time.Second)},
			{at: 100 * time.Millisecond, cost: 10, want: refused(0, time.Second, time.Second)},
		},
	},
	{
		name:  "cost equal to burst",
		limit: bucket.Limit{Requests: 10, Period: time.Second, Burst: 10},
		steps: []bucketStep{
			{at: 0, cost: 10, want: ok(0, time.Second)},
			{at: time.Second, cost: 10, want: ok(0, time.Second)},
		},
	},
	{
		name:  "cost above burst is refused even when full",
		limit: bucket.Limit{Requests: 10, Period: time.Second, Burst: 10},
		steps: []bucketStep{
			{at: 0, cost: 11, want: refused(10, 0, 0)},
			{at: 0, cost: 5, want: ok(5, 500*time.Millisecond)},
			{at: 0, cost: 11, want: refused(5, 500*time.Millisecond, 500*time.Millisecond)},
			{at: 0, cost: math.MaxUint64, want: refused(5, 500*time.Millisecond, 500*time.Millisecond)},
		},
	},
	{
		name:  "cost zero checks and takes nothing",
		limit: bucket.Limit{Requests: 10, Period: time.Second, Burst: 10},
		steps: []bucketStep{
			{at: 0, cost: 0, times: 100, want: ok(10, 0)},
			{at: 0, cost: 10, want: ok(0, time.Second)},
			{at: 0, cost: 0, want: ok(0, time.Second)}, // empty, not in debt
			{at: 100 * time.Millisecond, cost: 0, want: ok(1, 900*time.Millisecond)},
			{at: 100 * time.Millisecond, cost: 0, want: ok(1, 900*time.Millisecond)},
			{at: 100 * time.Millisecond, cost: 1, want: ok(0, time.Second)},
		},
	},
	{
		name:  "give back is capped at burst",
		limit: bucket.Limit{Requests: 10, Period: time.Second, Burst: 10},
		steps: []bucketStep{
			{at: 0, cost: 3, want: ok(7, 300*time.Millisecond)},
			{at: 0, cost: 2, give: true, want: ok(9, 100*time.Millisecond)},
			{at: 0, cost: 5, give: true, want: ok(10, 0)},
			{at: 0, cost: 0, want: ok(10, 0)},
			{at: 0, cost: 10, want: ok(0, time.Second)},
			{at: 0, cost: 1, want: refused(0, 100*time.Millisecond, time.Second)},
		},
	},
	{
		name:  "give back on a full bucket",
		limit: bucket.Limit{Requests: 10, Period: time.Second, Burst: 10},
		steps: []bucketStep{
			{at: 0, cost: 1, give: true, want: ok(10, 0)},
			{at: 0, cost: math.MaxUint64, give: true, want: ok(10, 0)},
			{at: 0, cost: 11, want: refused(10, 0, 0)},
		},
	},
	{
		name:  "give back of zero changes nothing",
		limit: bucket.Limit{Requests: 10, Period: time.Second, Burst: 10},
		steps: []bucketStep{
			{at: 0, cost: 4, want: ok(6, 400*time.Millisecond)},
			{at: 0, cost: 0, give: true, want: ok(6, 400*time.Millisecond)},
		},
	},
	{
		name:  "requests zero never allows",
		limit: bucket.Limit{Requests: 0, Period: time.Second, Burst: 10},
		steps: []bucketStep{
			{at: 0, cost: 1, want: refused(0, time.Second, time.Second)},
			{at: 0, cost: 0, want: refused(0, time.Second, time.Second)},
			{at: 0, cost: 1, give: true, want: ok(0, time.Second)},
			{at: year, cost: 1, want: refused(0, time.Second, time.Second)},
		},
	},
	{
		name:  "interval of a fraction of a nanosecond: 3 per second",
		limit: bucket.Limit{Requests: 3, Period: time.Second, Burst: 3},
		steps: []bucketStep{
			{at: 0, cost: 3, want: ok(0, time.Second)},
			// The first token is due at 333333333⅓ ns.
			{at: 333333333, cost: 1, want: refused(0, 1, 666666667)},
			{at: 333333334, cost: 0, want: ok(1, 666666666)},
			{at: 999999999, cost: 3, want: refused(2, 1, 1)},
			{at: time.Second, cost: 3, want: ok(0, time.Second)},
		},
	},
	{
		name:  "period with a unit multiplier: 5 per 2 seconds",
		limit: bucket.Limit{Requests: 5, Period: 2 * time.Second, Burst: 5},
		steps: []bucketStep{
			{at: 0, cost: 5, want: ok(0, 2*time.Second)},
			{at: 399 * time.Millisecond, cost: 1, want: refused(0, time.Millisecond, 1601*time.Millisecond)},
			{at: 400 * time.Millisecond, cost: 1, want: ok(0, 2*time.Second)},
		},
	},
	{
		name:  "one token a year",
		limit: bucket.Limit{Requests: 1, Period: year, Burst: 1},
		steps: []bucketStep{
			{at: 0, cost: 1, want: ok(0, year)},
			{at: year - 1, cost: 1, want: refused(0, 1, 1)},
			{at: year, cost: 1, want: ok(0, year)},
			{at: 100 * year, cost: 0, want: ok(1, 0)},
		},
	},
	{
		name:  "four billion a second",
		limit: bucket.Limit{Requests: 4e9, Period: time.Second, Burst: 4e9},
		steps: []bucketStep{
			{at: 0, cost: 4e9, want: ok(0, time.Second)},
			// A token is due every quarter nanosecond.
			{at: 0, cost: 1, want: refused(0, 1, time.Second)},
			{at: 1, cost: 5, want: refused(4, 1, time.Second-1)},
			{at: 1, cost: 4, want: ok(0, time.Second)},
			{at: time.Second + 1, cost: 4e9, want: ok(0, time.Second)},
		},
	},
}

// runScenario runs sc against a fresh bucket of a backend, whose hit function
// decides one hit at the scenario's time at (relative to its start).
func runScenario(t *testing.T, sc bucketScenario, hit func(at time.Duration, h bucket.Hit) bucket.State) {
	t.Helper()
	for i, step := range sc.steps {
		h := bucket.Hit{Limit: sc.limit, Cost: step.cost, Give: step.give}
		n := max(step.times, 1)
		for j := range n {
			got := hit(step.at, h)
			if j == n-1 {
				if diff := cmp.Diff(step.want, got); diff != "" {
					t.Fatalf("step %d (at %v, cost %d, give %t): state mismatch (-want +got):\n%s", i, step.at, step.cost, step.give, diff)
				}
			} else if got.Allowed != step.want.Allowed {
				t.Fatalf("step %d, repetition %d (at %v, cost %d, give %t): Allowed = %t, want %t", i, j, step.at, step.cost, step.give, got.Allowed, step.want.Allowed)
			}
		}
	}
}

func TestApplyScenarios(t *testing.T) {
	t.Parallel()
	for _, sc := range bucketScenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			const start = int64(1e15) // any origin works; not the epoch
			b := absent
			runScenario(t, sc, func(at time.Duration, h bucket.Hit) bucket.State {
				next, st, changed := applyCell(b, h.Limit, start+int64(at), h.Cost, h.Give)
				if changed {
					b = next
				}
				return st
			})
		})
	}
}

// refBucket is a reference token bucket in exact rational arithmetic: the
// textbook definition that apply must match.
type refBucket struct {
	lim    bucket.Limit
	tokens *big.Rat
	last   int64
}

func newRefBucket(lim bucket.Limit, now int64) *refBucket {
	return &refBucket{lim: lim, tokens: new(big.Rat).SetUint64(lim.Burst), last: now}
}

// ratNanosCeil returns ⌈x⌉ of a non-negative rational as a Duration.
func ratNanosCeil(x *big.Rat) time.Duration {
	q, r := new(big.Int).QuoRem(x.Num(), x.Denom(), new(big.Int))
	if r.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsInt64() {
		return math.MaxInt64
	}
	return time.Duration(q.Int64())
}

// hit mirrors apply: refill, decide, report.
func (rb *refBucket) hit(now int64, cost uint64, give bool) bucket.State {
	burst := new(big.Rat).SetUint64(rb.lim.Burst)
	rate := new(big.Rat).SetFrac(new(big.Int).SetUint64(rb.lim.Requests), big.NewInt(int64(rb.lim.Period))) // tokens per ns
	rb.tokens.Add(rb.tokens, new(big.Rat).Mul(rate, new(big.Rat).SetInt64(now-rb.last)))
	if rb.tokens.Cmp(burst) > 0 {
		rb.tokens.Set(burst)
	}
	rb.last = now
	c := new(big.Rat).SetUint64(cost)
	// timeFor returns the time until the bucket holds n tokens.
	timeFor := func(n *big.Rat) time.Duration {
		missing := new(big.Rat).Sub(n, rb.tokens)
		if missing.Sign() <= 0 {
			return 0
		}
		return ratNanosCeil(missing.Quo(missing, rate))
	}
	var st bucket.State
	switch {
	case give:
		rb.tokens.Add(rb.tokens, c)
		if rb.tokens.Cmp(burst) > 0 {
			rb.tokens.Set(burst)
		}
		st.Allowed = true
	case cost > rb.lim.Burst:
		st.RetryAfter = timeFor(burst)
	default:
		if rb.tokens.Cmp(c) >= 0 { // a check (cost 0) is refused only in debt
			st.Allowed = true
			rb.tokens.Sub(rb.tokens, c)
		} else {
			st.RetryAfter = timeFor(c)
		}
	}
	whole := new(big.Int).Quo(rb.tokens.Num(), rb.tokens.Denom())
	st.Remaining = whole.Uint64()
	st.ResetAfter = timeFor(burst)
	return st
}

// TestApplyMatchesExactReference drives apply and the rational reference
// with the same random hits, over limits from one token a year to billions a
// second and gaps from a nanosecond to years, and requires identical states:
// apply is exact, with no drift however many hits it takes.
func TestApplyMatchesExactReference(t *testing.T) {
	t.Parallel()
	limits := []bucket.Limit{
		{Requests: 10, Period: time.Second, Burst: 10},
		{Requests: 3, Period: time.Second, Burst: 2},
		{Requests: 7, Period: 3 * time.Second, Burst: 20},
		{Requests: 1, Period: year, Burst: 1},
		{Requests: 1, Period: year, Burst: 50},
		{Requests: 4e9, Period: time.Second, Burst: 4e9},
		{Requests: 4e9, Period: time.Second, Burst: 1},
		{Requests: 999_999_937, Period: 24 * time.Hour, Burst: 123_456_789}, // prime rate
		{Requests: math.MaxUint32, Period: 7 * time.Nanosecond, Burst: math.MaxUint32},
	}
	for _, lim := range limits {
		t.Run(fmtLimit(lim), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(uint64(lim.Requests), uint64(lim.Period)))
			// Gaps are mostly a fraction of a few token intervals, so
			// buckets hover between empty and full, and sometimes long
			// enough to refill completely. All are capped (at 2⁵⁰ ns, 13
			// days) so that slow limits still get many steps.
			interval := max(int64(lim.Period)/int64(lim.Requests), 1)
			refill := int64(min(float64(lim.Period)/float64(lim.Requests)*float64(lim.Burst), 1<<50))
			now := int64(12345)
			b := absent
			ref := newRefBucket(lim, now)
			for i := range 20000 {
				switch rng.IntN(10) {
				case 0: // long idle
					now += rng.Int64N(2*refill + 1)
				case 1, 2: // same instant
				default:
					now += rng.Int64N(min(3*interval, 1<<50)/int64(1+rng.IntN(50)) + 1)
				}
				cost := rng.Uint64N(min(lim.Burst, 1<<20) + 2) // sometimes above burst
				if rng.IntN(4) == 0 {
					cost = rng.Uint64N(lim.Burst + 2)
				}
				give := rng.IntN(10) == 0
				next, got, changed := applyCell(b, lim, now, cost, give)
				if changed {
					b = next
				}
				// == first: cmp.Diff on each of the 180,000 hits was a
				// fifth of the package's CPU under -race.
				if want := ref.hit(now, cost, give); got != want {
					t.Fatalf("hit %d at %d ns, cost %d, give %t: state mismatch (-want +got):\n%s", i, now, cost, give, cmp.Diff(want, got))
				}
			}
		})
	}
}

// TestApplyLongRunNoDrift takes a token every 100ms from a bucket refilling
// 3 a second for 10⁶ steps (over a day): exactly 3 per second are admitted.
func TestApplyLongRunNoDrift(t *testing.T) {
	t.Parallel()
	lim := bucket.Limit{Requests: 3, Period: time.Second, Burst: 2}
	b := absent
	var admitted uint64
	const steps = 1_000_000
	step := int64(100 * time.Millisecond)
	for i := range int64(steps) + 1 {
		next, st, changed := applyCell(b, lim, i*step, 1, false)
		if changed {
			b = next
		}
		if st.Allowed {
			admitted++
		}
	}
	elapsed := time.Duration(steps * step)
	want := lim.Burst + uint64(elapsed/time.Second)*3
	if admitted != want {
		t.Errorf("admitted %d in %v at 3/s burst 2, want %d", admitted, elapsed, want)
	}
}

// TestApplyExtremes checks that the largest inputs neither panic nor wrap:
// results saturate and stay on the safe side.
func TestApplyExtremes(t *testing.T) {
	t.Parallel()
	huge := bucket.Limit{Requests: 1, Period: math.MaxInt64, Burst: math.MaxUint64}
	tests := []struct {
		name  string
		b     cell
		lim   bucket.Limit
		now   int64
		cost  uint64
		give  bool
		want  bucket.State
		check func(t *testing.T, next cell)
	}{
		{
			name: "drain a bucket that takes forever to refill",
			b:    absent, lim: huge, now: 0, cost: math.MaxUint64,
			want: ok(0, math.MaxInt64),
			check: func(t *testing.T, next cell) {
				if next.tat != math.MaxInt64 {
					t.Errorf("tat = %d, want saturated %d", next.tat, int64(math.MaxInt64))
				}
			},
		},
		{
			name: "take from a saturated bucket",
			b:    cell{gcra: gcra{tat: math.MaxInt64}, lim: huge}, lim: huge, now: 0, cost: 1,
			want: ok(math.MaxUint64-2, math.MaxInt64),
		},
		{
			name: "give back everything to a saturated bucket",
			b:    cell{gcra: gcra{tat: math.MaxInt64}, lim: huge}, lim: huge, now: 0, cost: math.MaxUint64, give: true,
			want: ok(math.MaxUint64, 0),
		},
		{
			name: "times at both ends of the range",
			b:    cell{gcra: gcra{tat: math.MaxInt64}, lim: bucket.Limit{Requests: math.MaxUint64, Period: 1, Burst: math.MaxUint64}}, lim: bucket.Limit{Requests: math.MaxUint64, Period: 1, Burst: math.MaxUint64},
			now: math.MinInt64, cost: 1,
			want: refused(0, math.MaxInt64, math.MaxInt64),
		},
		{
			name: "max rate at the end of time",
			b:    absent, lim: bucket.Limit{Requests: math.MaxUint64, Period: 1, Burst: math.MaxUint64},
			now: math.MaxInt64, cost: math.MaxUint64,
			want: ok(0, 1),
		},
		{
			// 10ns + 2/3ns under 3 per 10ns lacks 3.2 tokens, which take
			// 32ns under 1 per 10ns.
			name: "rate changed: the fraction converts",
			b:    cell{gcra: gcra{tat: 10, frac: 2}, lim: bucket.Limit{Requests: 3, Period: 10, Burst: 5}}, lim: bucket.Limit{Requests: 1, Period: 10, Burst: 5},
			now: 0, cost: 0,
			want: ok(1, 32),
		},
		{
			// 100 lacking under burst 5 stay lacking: a take waits for 96
			// to refill.
			name: "burst lowered below the deficit: nothing forgiven",
			b:    cell{gcra: gcra{tat: 1000}, lim: bucket.Limit{Requests: 1, Period: 10, Burst: 100}}, lim: bucket.Limit{Requests: 1, Period: 10, Burst: 5},
			now: 0, cost: 1,
			want: refused(0, 960, 1000),
		},
		{
			// A deficit of ~2¹²⁷ units converted to a Period 2⁴⁰ times
			// longer needs more than 128 bits: it saturates (the TAT at the
			// end of int64 time, as bucketAt does), it does not wrap to a
			// full bucket.
			name: "conversion beyond 128 bits saturates",
			b:    cell{gcra: gcra{tat: math.MaxInt64}, lim: bucket.Limit{Requests: math.MaxUint64, Period: 1, Burst: math.MaxUint64}},
			lim:  bucket.Limit{Requests: 1, Period: 1 << 40, Burst: 5},
			now:  0, cost: 1,
			want: refused(0, math.MaxInt64-4<<40, math.MaxInt64),
		},
		{
			name: "zero period never allows",
			b:    absent, lim: bucket.Limit{Requests: 1, Period: 0, Burst: 5},
			now: 0, cost: 1,
			want: refused(0, 0, 0),
		},
		{
			name: "zero burst never allows",
			b:    absent, lim: bucket.Limit{Requests: 1, Period: time.Second, Burst: 0},
			now: 0, cost: 0,
			want: refused(0, time.Second, time.Second),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			next, got, _ := applyCell(tt.b, tt.lim, tt.now, tt.cost, tt.give)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("apply(%+v, %+v, %d, %d, %t) state mismatch (-want +got):\n%s", tt.b, tt.lim, tt.now, tt.cost, tt.give, diff)
			}
			if tt.check != nil {
				tt.check(t, next)
			}
		})
	}
}

func TestU128(t *testing.T) {
	t.Parallel()
	const m = math.MaxUint64
	tests := []struct {
		name string
		got  any
		want any
	}{
		{"mul max", mul64(m, m), u128{m - 1, 1}},
		{"add carries", u128{0, m}.add(u128{0, 1}), u128{1, 0}},
		{"add saturates", u128{m, m}.add(u128{0, 1}), u128{m, m}},
		{"sub borrows", u128{1, 0}.sub(u128{0, 1}), u128{0, m}},
		{"sub floors at zero", u128{0, 1}.sub(u128{0, 2}), u128{}},
		{"lessEq equal", u128{1, 2}.lessEq(u128{1, 2}), true},
		{"lessEq by hi", u128{1, 0}.lessEq(u128{0, m}), false},
		{"ceilDiv exact", u128{0, 10}.ceilDiv(5), uint64(2)},
		{"ceilDiv rounds up", u128{0, 11}.ceilDiv(5), uint64(3)},
		{"ceilDiv wide", mul64(m, 3).ceilDiv(3), uint64(m)},
		{"ceilDiv saturates", mul64(m, 3).add(u128{0, 1}).ceilDiv(3), uint64(m)},
		{"ceilDiv overflow", u128{5, 0}.ceilDiv(5), uint64(m)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if tt.got != tt.want {
				t.Errorf("got %v, want %v", tt.got, tt.want)
			}
		})
	}
}

// FuzzApply compares apply with the rational reference on arbitrary limits
// and hits; `go test -fuzz FuzzApply` explores beyond the seeds.
func FuzzApply(f *testing.F) {
	f.Add(uint64(10), int64(time.Second), uint64(10), []byte{1, 0, 3, 200, 7})
	f.Add(uint64(1), int64(year), uint64(3), []byte{255, 1, 2, 3})
	f.Add(uint64(4e9), int64(time.Second), uint64(4e9), []byte{9, 9, 9, 0, 0})
	f.Fuzz(func(t *testing.T, requests uint64, period int64, burst uint64, ops []byte) {
		requests = requests%1e12 + 1
		period = period%int64(10*year) + 1
		if period <= 0 {
			period += int64(10 * year)
		}
		burst = burst%1e12 + 1
		lim := bucket.Limit{Requests: requests, Period: time.Duration(period), Burst: burst}
		if float64(period)/float64(requests)*float64(burst) > 1<<60 { // keep TATs inside the int64 range
			t.Skip()
		}
		interval := max(period/int64(requests), 1)
		now := int64(0)
		b := absent
		ref := newRefBucket(lim, now)
		for i, op := range ops {
			if now += int64(op>>4) * interval / 4; now > 1<<60 {
				break
			}
			cost := uint64(op & 7)
			if op&8 != 0 {
				cost = burst - uint64(op&7)%burst
			}
			give := op&0xf0 == 0xf0
			next, got, changed := applyCell(b, lim, now, cost, give)
			if changed {
				b = next
			}
			if want := ref.hit(now, cost, give); want != got {
				t.Fatalf("%+v hit %d at %d, cost %d, give %t: got %+v, want %+v", lim, i, now, cost, give, got, want)
			}
		}
	})
}

// fmtLimit names a subtest after a limit.
func fmtLimit(l bucket.Limit) string {
	return fmt.Sprintf("%d_per_%v_burst_%d", l.Requests, l.Period, l.Burst)
}

// TestApplyLimitChange checks the conversion of a bucket hit under another
// Limit than it was written with: what it lacks stays lacking, in tokens,
// never clamped to the new burst, and the converted bucket is stored at the first
// hit under the new Limit, refused or not, so that it refills at the new
// rate from then on.
func TestApplyLimitChange(t *testing.T) {
	t.Parallel()
	const day = 24 * time.Hour
	per := func(n uint64, p time.Duration) bucket.Limit { return bucket.Limit{Requests: n, Period: p, Burst: n} }
	type step struct {
		lim  bucket.Limit
		at   time.Duration
		cost uint64
		want bucket.State
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"3/day spent, raised to 4/day: exactly one more", []step{
			{per(3, day), 0, 3, ok(0, day)},
			{per(4, day), 0, 1, ok(0, day)},
			{per(4, day), 0, 1, refused(0, 6*time.Hour, day)},
		}},
		{"4/day, 2 spent, lowered to 2/day: refused until one refills", []step{
			{per(4, day), 0, 2, ok(2, 12*time.Hour)},
			{per(2, day), 0, 1, refused(0, 12*time.Hour, day)},
			{per(2, day), 12*time.Hour - 1, 1, refused(0, 1, 12*time.Hour+1)},
			{per(2, day), 12 * time.Hour, 1, ok(0, day)},
		}},
		{"a fraction of a token converts: 2.5 of 3/day lacking is 2.5 of 4/day", []step{
			{per(3, day), 0, 3, ok(0, day)},
			{per(4, day), 4 * time.Hour, 0, ok(1, 15*time.Hour)},
		}},
		{"a full bucket stays full", []step{
			{per(3, day), 0, 1, ok(2, 8*time.Hour)},
			{per(1, time.Hour), 8 * time.Hour, 0, ok(1, 0)},
		}},
		{"burst raised alone: spent stays spent", []step{
			{per(3, day), 0, 3, ok(0, day)},
			{bucket.Limit{Requests: 3, Period: day, Burst: 6}, 0, 0, ok(3, day)},
		}},
		// 5 lacking under burst 3 stay lacking: nothing until 3 refilled,
		// and back under burst 6, 1 left.
		{"burst lowered alone: nothing forgiven", []step{
			{bucket.Limit{Requests: 3, Period: day, Burst: 6}, 0, 5, ok(1, 40*time.Hour)},
			{per(3, day), 0, 0, refused(0, 16*time.Hour, 40*time.Hour)}, // 5 lacking of 3: in debt until 2 refilled
			{bucket.Limit{Requests: 3, Period: day, Burst: 6}, 0, 0, ok(1, 40*time.Hour)},
			{per(3, day), day - 1, 1, refused(0, 1, 16*time.Hour+1)},
			{per(3, day), day, 1, ok(0, day)},
		}},
		{"4/day, 3 spent, lowered to 2/day: the excess refills first", []step{
			{per(4, day), 0, 3, ok(1, 18*time.Hour)},
			{per(2, day), 0, 1, refused(0, day, 36*time.Hour)},
			{per(4, day), 0, 0, ok(1, 18*time.Hour)},
		}},
		// Concurrent calls may read a bucket at an earlier time than
		// another wrote it: that lacks more than the burst, which under an
		// unchanged Limit is not clamped (it would make tokens).
		{"an earlier time under the same limit is not a lowered burst", []step{
			{per(3, day), 10 * time.Hour, 3, ok(0, day)},
			{per(3, day), 9 * time.Hour, 0, refused(0, time.Hour, 25*time.Hour)}, // 3⅛ lacking of 3: in debt
			{per(3, day), 18*time.Hour - 1, 1, refused(0, 1, 16*time.Hour+1)},
		}},
		{"period changed: 3/day spent 2, now 3/hour: 2 of 3 lacking", []step{
			{per(3, day), 0, 2, ok(1, 16*time.Hour)},
			{per(3, time.Hour), 0, 1, ok(0, time.Hour)},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l := New(Options{})
			for i, s := range tt.steps {
				states := make([]bucket.State, 1)
				l.HitAt(t0.Add(s.at), []bucket.Hit{{Key: key(1), Limit: s.lim, Cost: s.cost}}, states)
				if diff := cmp.Diff(s.want, states[0]); diff != "" {
					t.Fatalf("step %d (%+v at %v, cost %d) mismatch (-want +got):\n%s", i, s.lim, s.at, s.cost, diff)
				}
			}
		})
	}
}

// TestMulDivCeil checks the 192-bit product and division against math/big.
func TestMulDivCeil(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		d := rng.Uint64() | 1
		m := rng.Uint64() >> rng.IntN(64)
		x := u128{hi: rng.Uint64() >> rng.IntN(65), lo: rng.Uint64()}
		bx := new(big.Int).Lsh(new(big.Int).SetUint64(x.hi), 64)
		bx.Add(bx, new(big.Int).SetUint64(x.lo))
		prod := new(big.Int).Mul(bx, new(big.Int).SetUint64(m))
		want, rem := new(big.Int).QuoRem(prod, new(big.Int).SetUint64(d), new(big.Int))
		if rem.Sign() != 0 {
			want.Add(want, big.NewInt(1))
		}
		if want.BitLen() > 128 {
			continue // outside mulDivCeil's domain
		}
		got := mulDivCeil(x, m, d)
		gotBig := new(big.Int).Lsh(new(big.Int).SetUint64(got.hi), 64)
		gotBig.Add(gotBig, new(big.Int).SetUint64(got.lo))
		if gotBig.Cmp(want) != 0 {
			t.Fatalf("mulDivCeil(%v, %d, %d) = %v, want %v", x, m, d, gotBig, want)
		}
	}
}
