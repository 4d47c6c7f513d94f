package buckettest

import (
	"time"

	"github.com/sluice-rls/sluice/bucket"
)

// scenario is a sequence of calls on one fresh Limiter.
type scenario struct {
	name  string
	calls []call
	// stretch is the largest ratio of a key's new token interval to its
	// old one where a call changes its Limit (0 and 1: no slower rate): a
	// Limiter on a real clock converts the bucket as late as it runs, and
	// its durations may come out short by its lag times stretch (Run).
	stretch int
}

// call is one call of Limiter.Hit and what it must answer.
type call struct {
	advance time.Duration // the clock moves this much before the call
	hits    []hit
	allowed bool           // Decision.Allowed
	states  []bucket.State // one per hit
}

// hit is a bucket.Hit whose key is a number, made a Key per scenario.
type hit struct {
	key         int
	limit       bucket.Limit
	cost        uint64
	give        bool
	independent bool
	overdraw    bool
}

func take(k int, lim bucket.Limit, cost uint64) hit { return hit{key: k, limit: lim, cost: cost} }
func check(k int, lim bucket.Limit) hit             { return hit{key: k, limit: lim} }
func give(k int, lim bucket.Limit, cost uint64) hit {
	return hit{key: k, limit: lim, cost: cost, give: true}
}
func shadow(h hit) hit { h.independent = true; return h }

// charge is a post-charge: an independent take that overdraws.
func charge(h hit) hit { h.independent, h.overdraw = true, true; return h }

// ok is the state of an allowed hit that leaves remaining tokens, the
// bucket full again after reset.
func ok(remaining uint64, reset time.Duration) bucket.State {
	return bucket.State{Allowed: true, Remaining: remaining, ResetAfter: reset}
}

// no is the state of a refused hit.
func no(remaining uint64, retry, reset time.Duration) bucket.State {
	return bucket.State{Remaining: remaining, RetryAfter: retry, ResetAfter: reset}
}

var (
	// perMinute refills a token a minute, ten at most: slow enough that a
	// real clock's lag never refills a token within a scenario.
	perMinute = bucket.Limit{Requests: 10, Period: 10 * time.Minute, Burst: 10}
	// smallBurst refills as perMinute but holds four tokens: Burst is not
	// Requests.
	smallBurst = bucket.Limit{Requests: 10, Period: 10 * time.Minute, Burst: 4}
	// fast refills a token every 100ms, three at most, for the scenarios
	// that move the clock. 100ms is the margin a Limiter on a real clock
	// has for its lag, and keeps the real waiting of backend/redis short.
	fast = bucket.Limit{Requests: 10, Period: time.Second, Burst: 3}
	// never allows anything (a rule of requests_per_unit 0).
	never = bucket.Limit{Requests: 0, Period: time.Minute, Burst: 0}
	// The limits a key moves through in the scenarios of a changed limit.
	twoPerDay   = bucket.Limit{Requests: 2, Period: day, Burst: 2}
	threePerDay = bucket.Limit{Requests: 3, Period: day, Burst: 3}
	fourPerDay  = bucket.Limit{Requests: 4, Period: day, Burst: 4}
	onePerDay   = bucket.Limit{Requests: 1, Period: day, Burst: 1}
	// perMinute with twice the burst, and at a sixth of its rate.
	bigBurst  = bucket.Limit{Requests: 10, Period: 10 * time.Minute, Burst: 20}
	tenAnHour = bucket.Limit{Requests: 10, Period: time.Hour, Burst: 10}
	// perMinute at half its rate and half its burst.
	halfPerMinute = bucket.Limit{Requests: 5, Period: 10 * time.Minute, Burst: 5}
	// Limits that move the clock: 4 or 2 per 400ms (a token every 100ms or
	// 200ms), and fast at half its rate.
	fourFast = bucket.Limit{Requests: 4, Period: 400 * time.Millisecond, Burst: 4}
	twoFast  = bucket.Limit{Requests: 2, Period: 400 * time.Millisecond, Burst: 2}
	halfFast = bucket.Limit{Requests: 5, Period: time.Second, Burst: 3}
)

const (
	minute = time.Minute
	day    = 24 * time.Hour
	ms     = time.Millisecond
)

var scenarios = []scenario{
	{
		name: "take",
		calls: []call{
			{hits: []hit{take(0, perMinute, 1)}, allowed: true, states: []bucket.State{ok(9, minute)}},
			{hits: []hit{take(0, perMinute, 3)}, allowed: true, states: []bucket.State{ok(6, 4*minute)}},
			// More than is left, within the burst: refused until one more
			// token refills, and nothing taken.
			{hits: []hit{take(0, perMinute, 7)}, allowed: false, states: []bucket.State{no(6, minute, 4*minute)}},
			{hits: []hit{take(0, perMinute, 6)}, allowed: true, states: []bucket.State{ok(0, 10*minute)}},
			{hits: []hit{take(0, perMinute, 1)}, allowed: false, states: []bucket.State{no(0, minute, 10*minute)}},
		},
	},
	{
		// A refused call takes nothing, in any bucket, whichever hit
		// refuses it; its allowed takes report their buckets untouched.
		name: "all-or-nothing refusal",
		calls: []call{
			{hits: []hit{take(2, perMinute, 9)}, allowed: true, states: []bucket.State{ok(1, 9*minute)}},
			{
				hits:    []hit{take(0, perMinute, 1), take(1, perMinute, 2), take(2, perMinute, 2), take(3, perMinute, 1)},
				allowed: false,
				states:  []bucket.State{ok(10, 0), ok(10, 0), no(1, minute, 9*minute), ok(10, 0)},
			},
			{
				hits:    []hit{check(0, perMinute), check(1, perMinute), check(2, perMinute), check(3, perMinute)},
				allowed: true,
				states:  []bucket.State{ok(10, 0), ok(10, 0), ok(1, 9*minute), ok(10, 0)},
			},
			// The refusing hit first.
			{hits: []hit{take(2, perMinute, 2), take(0, perMinute, 5)}, allowed: false, states: []bucket.State{no(1, minute, 9*minute), ok(10, 0)}},
			{hits: []hit{check(0, perMinute)}, allowed: true, states: []bucket.State{ok(10, 0)}},
		},
	},
	{
		// A refused call reports every other take's bucket as a check of it
		// would: its limit's whole tokens, untouched, and the time until it
		// is full. Also when the refusing bucket is known empty without
		// asking the store (backend/redis's empty-bucket cache, lease's
		// held counts), or refuses by its Requests 0.
		name: "refused call: the other takes report their buckets",
		calls: []call{
			{hits: []hit{take(0, perMinute, 10)}, allowed: true, states: []bucket.State{ok(0, 10*minute)}},
			{hits: []hit{take(1, perMinute, 3)}, allowed: true, states: []bucket.State{ok(7, 3*minute)}},
			{hits: []hit{take(1, perMinute, 1), take(0, perMinute, 1)}, allowed: false, states: []bucket.State{ok(7, 3*minute), no(0, minute, 10*minute)}},
			{hits: []hit{take(0, perMinute, 1), take(1, perMinute, 2)}, allowed: false, states: []bucket.State{no(0, minute, 10*minute), ok(7, 3*minute)}},
			{hits: []hit{take(2, perMinute, 1), take(0, perMinute, 1)}, allowed: false, states: []bucket.State{ok(10, 0), no(0, minute, 10*minute)}},
			// More than the other bucket holds: it refuses too.
			{hits: []hit{take(1, perMinute, 8), take(0, perMinute, 1)}, allowed: false, states: []bucket.State{no(7, minute, 3*minute), no(0, minute, 10*minute)}},
			{hits: []hit{take(1, perMinute, 2), take(3, never, 1)}, allowed: false, states: []bucket.State{ok(7, 3*minute), no(0, minute, minute)}},
			{hits: []hit{take(4, perMinute, 2), take(3, never, 1)}, allowed: false, states: []bucket.State{ok(10, 0), no(0, minute, minute)}},
			{hits: []hit{take(4, perMinute, 1), take(0, perMinute, 1)}, allowed: false, states: []bucket.State{ok(10, 0), no(0, minute, 10*minute)}},
			{hits: []hit{check(1, perMinute), check(2, perMinute)}, allowed: true, states: []bucket.State{ok(7, 3*minute), ok(10, 0)}},
		},
	},
	{
		name: "gives on an allowed call",
		calls: []call{
			{hits: []hit{take(0, perMinute, 5)}, allowed: true, states: []bucket.State{ok(5, 5*minute)}},
			{hits: []hit{give(0, perMinute, 3), take(1, perMinute, 1)}, allowed: true, states: []bucket.State{ok(8, 2*minute), ok(9, minute)}},
			// Never above the burst.
			{hits: []hit{give(0, perMinute, 5)}, allowed: true, states: []bucket.State{ok(10, 0)}},
			{hits: []hit{give(2, perMinute, 1)}, allowed: true, states: []bucket.State{ok(10, 0)}},
			{hits: []hit{check(0, perMinute), check(1, perMinute)}, allowed: true, states: []bucket.State{ok(10, 0), ok(9, minute)}},
		},
	},
	{
		// A give is never refused and is applied whatever the decision
		// (bucket.Hit): a refused call still returns its gives' tokens,
		// before or after the hit that refuses it.
		name: "gives on a refused call",
		calls: []call{
			{hits: []hit{take(0, perMinute, 5), take(1, perMinute, 10)}, allowed: true, states: []bucket.State{ok(5, 5*minute), ok(0, 10*minute)}},
			{hits: []hit{give(0, perMinute, 3), take(1, perMinute, 1)}, allowed: false, states: []bucket.State{ok(8, 2*minute), no(0, minute, 10*minute)}},
			{hits: []hit{take(1, perMinute, 1), give(0, perMinute, 1)}, allowed: false, states: []bucket.State{no(0, minute, 10*minute), ok(9, minute)}},
			{hits: []hit{check(0, perMinute)}, allowed: true, states: []bucket.State{ok(9, minute)}},
		},
	},
	{
		// Cost 0 takes nothing and is refused only when the bucket is in
		// debt (lacks more than its burst), not when it is empty.
		name: "check only",
		calls: []call{
			{hits: []hit{check(0, perMinute)}, allowed: true, states: []bucket.State{ok(10, 0)}},
			{hits: []hit{take(0, perMinute, 9)}, allowed: true, states: []bucket.State{ok(1, 9*minute)}},
			{hits: []hit{check(0, perMinute), check(0, perMinute)}, allowed: true, states: []bucket.State{ok(1, 9*minute), ok(1, 9*minute)}},
			{hits: []hit{take(0, perMinute, 1)}, allowed: true, states: []bucket.State{ok(0, 10*minute)}},
			{hits: []hit{check(0, perMinute)}, allowed: true, states: []bucket.State{ok(0, 10*minute)}},
			// 2 tokens of debt: 12 lacking of 10.
			{hits: []hit{charge(take(0, perMinute, 2))}, allowed: true, states: []bucket.State{no(0, 4*minute, 12*minute)}},
			{hits: []hit{check(0, perMinute)}, allowed: false, states: []bucket.State{no(0, 2*minute, 12*minute)}},
			// A refused check refuses its call.
			{hits: []hit{take(1, perMinute, 1), check(0, perMinute)}, allowed: false, states: []bucket.State{ok(10, 0), no(0, 2*minute, 12*minute)}},
			{hits: []hit{check(1, perMinute)}, allowed: true, states: []bucket.State{ok(10, 0)}},
		},
	},
	{
		// Independent checks (what GET /usage sends) read a bucket and
		// change nothing: not a partly drained bucket, not an empty one,
		// not one that does not exist; and an empty one refuses nothing.
		name: "independent checks change nothing",
		calls: []call{
			{hits: []hit{take(0, perMinute, 4)}, allowed: true, states: []bucket.State{ok(6, 4*minute)}},
			{hits: []hit{shadow(check(0, perMinute)), shadow(check(1, perMinute))}, allowed: true, states: []bucket.State{ok(6, 4*minute), ok(10, 0)}},
			{hits: []hit{take(0, perMinute, 6)}, allowed: true, states: []bucket.State{ok(0, 10*minute)}},
			{hits: []hit{shadow(check(0, perMinute)), take(1, perMinute, 1)}, allowed: true, states: []bucket.State{ok(0, 10*minute), ok(9, minute)}},
			{hits: []hit{shadow(check(0, perMinute)), shadow(check(1, perMinute))}, allowed: true, states: []bucket.State{ok(0, 10*minute), ok(9, minute)}},
			{hits: []hit{take(1, perMinute, 9)}, allowed: true, states: []bucket.State{ok(0, 10*minute)}},
		},
	},
	{
		// Independent (shadow-mode) hits take their tokens when they can,
		// never block the others, and are applied when the call is refused.
		name: "independent hits",
		calls: []call{
			{hits: []hit{take(0, perMinute, 10)}, allowed: true, states: []bucket.State{ok(0, 10*minute)}},
			{hits: []hit{shadow(take(0, perMinute, 1)), take(1, perMinute, 1)}, allowed: true, states: []bucket.State{no(0, minute, 10*minute), ok(9, minute)}},
			{hits: []hit{shadow(take(2, perMinute, 3)), take(0, perMinute, 1)}, allowed: false, states: []bucket.State{ok(7, 3*minute), no(0, minute, 10*minute)}},
			// Only independent hits: allowed, whatever each says.
			{hits: []hit{shadow(take(3, perMinute, 2)), shadow(take(0, perMinute, 1))}, allowed: true, states: []bucket.State{ok(8, 2*minute), no(0, minute, 10*minute)}},
			{
				hits:    []hit{check(1, perMinute), check(2, perMinute), check(3, perMinute)},
				allowed: true,
				states:  []bucket.State{ok(9, minute), ok(7, 3*minute), ok(8, 2*minute)},
			},
		},
	},
	{
		// A cost above the burst is never allowed; its RetryAfter is the
		// time until the bucket is full (0 when it is).
		name: "cost above burst",
		calls: []call{
			{hits: []hit{take(0, perMinute, 11)}, allowed: false, states: []bucket.State{no(10, 0, 0)}},
			{hits: []hit{take(0, perMinute, 3)}, allowed: true, states: []bucket.State{ok(7, 3*minute)}},
			{hits: []hit{take(0, perMinute, 11)}, allowed: false, states: []bucket.State{no(7, 3*minute, 3*minute)}},
			{hits: []hit{take(1, perMinute, 1), take(0, perMinute, 11)}, allowed: false, states: []bucket.State{ok(10, 0), no(7, 3*minute, 3*minute)}},
			{hits: []hit{check(1, perMinute)}, allowed: true, states: []bucket.State{ok(10, 0)}},
			// The burst, not Requests, is the bound.
			{hits: []hit{take(2, smallBurst, 5)}, allowed: false, states: []bucket.State{no(4, 0, 0)}},
			{hits: []hit{take(2, smallBurst, 4)}, allowed: true, states: []bucket.State{ok(0, 4*minute)}},
		},
	},
	{
		// Requests 0 never allows a take or a check, and refuses its call;
		// a give to it is allowed and does nothing.
		//
		// The backends disagree on one duration: a give's ResetAfter is the
		// Period in backend/memory and 0 in backend/redis.
		name: "Requests 0",
		calls: []call{
			{hits: []hit{take(0, never, 1)}, allowed: false, states: []bucket.State{no(0, minute, minute)}},
			{hits: []hit{check(0, never)}, allowed: false, states: []bucket.State{no(0, minute, minute)}},
			// It refuses its call; the call's independent hits and gives
			// still apply (with another take: "refused call: the other
			// takes report their buckets").
			{
				hits:    []hit{shadow(take(1, perMinute, 1)), give(2, perMinute, 1), take(0, never, 1)},
				allowed: false,
				states:  []bucket.State{ok(9, minute), ok(10, 0), no(0, minute, minute)},
			},
			{hits: []hit{shadow(take(0, never, 1)), take(1, perMinute, 1)}, allowed: true, states: []bucket.State{no(0, minute, minute), ok(8, 2*minute)}},
			{hits: []hit{give(0, never, 1)}, allowed: true, states: []bucket.State{{Allowed: true, ResetAfter: anyDuration}}},
			{hits: []hit{check(0, never)}, allowed: false, states: []bucket.State{no(0, minute, minute)}},
		},
	},
	{
		// Buckets refill evenly over time, never above the burst. Every
		// check lands on a whole token, 100ms (a token) from the next.
		name: "refill over time",
		calls: []call{
			{hits: []hit{take(0, fast, 3)}, allowed: true, states: []bucket.State{ok(0, 300*time.Millisecond)}},
			{advance: 100 * time.Millisecond, hits: []hit{check(0, fast)}, allowed: true, states: []bucket.State{ok(1, 200*time.Millisecond)}},
			{hits: []hit{take(0, fast, 1)}, allowed: true, states: []bucket.State{ok(0, 300*time.Millisecond)}},
			{hits: []hit{take(0, fast, 1)}, allowed: false, states: []bucket.State{no(0, 100*time.Millisecond, 300*time.Millisecond)}},
			{hits: []hit{take(0, fast, 2)}, allowed: false, states: []bucket.State{no(0, 200*time.Millisecond, 300*time.Millisecond)}},
			{advance: 200 * time.Millisecond, hits: []hit{check(0, fast)}, allowed: true, states: []bucket.State{ok(2, 100*time.Millisecond)}},
			{advance: 100 * time.Millisecond, hits: []hit{check(0, fast)}, allowed: true, states: []bucket.State{ok(3, 0)}},
			{advance: 200 * time.Millisecond, hits: []hit{check(0, fast)}, allowed: true, states: []bucket.State{ok(3, 0)}},
		},
	},
	{
		// The takes are decided first, all-or-nothing, against the buckets
		// as they stood before the call; a give on their key comes after
		// them, so it cannot make room for them.
		//
		// The backends report the refused take differently (memory: its
		// bucket as the call leaves it, after the give; backend/redis: as
		// the takes found it), so only its decision and RetryAfter are
		// asserted; the check that follows asserts the bucket.
		name: "same key: a give does not help a take of the same call",
		calls: []call{
			{hits: []hit{take(0, perMinute, 10)}, allowed: true, states: []bucket.State{ok(0, 10*minute)}},
			{hits: []hit{give(0, perMinute, 4), take(0, perMinute, 4)}, allowed: false, states: []bucket.State{ok(4, 6*minute), no(anyRemaining, 4*minute, anyDuration)}},
			{hits: []hit{check(0, perMinute)}, allowed: true, states: []bucket.State{ok(4, 6*minute)}},
		},
	},
	{
		// An independent hit is decided after the takes, so it never blocks
		// a take on its key, whatever their order in the call.
		name: "same key: an independent hit does not block a later take",
		calls: []call{
			{hits: []hit{shadow(take(0, perMinute, 5)), take(0, perMinute, 8)}, allowed: true, states: []bucket.State{no(2, 3*minute, 8*minute), ok(2, 8*minute)}},
			{hits: []hit{check(0, perMinute)}, allowed: true, states: []bucket.State{ok(2, 8*minute)}},
		},
	},
	{
		// A give before a take on a full bucket is applied after it, so it
		// returns tokens the take took instead of spilling over the burst.
		name: "same key: a give before a take returns the take's tokens",
		calls: []call{
			{hits: []hit{give(0, perMinute, 2), take(0, perMinute, 3)}, allowed: true, states: []bucket.State{ok(9, minute), ok(7, 3*minute)}},
			{hits: []hit{check(0, perMinute)}, allowed: true, states: []bucket.State{ok(9, minute)}},
		},
	},
	{
		// A key's second take sees its first.
		name: "same key twice in one call",
		calls: []call{
			{hits: []hit{take(0, perMinute, 6), take(0, perMinute, 4)}, allowed: true, states: []bucket.State{ok(4, 6*minute), ok(0, 10*minute)}},
			{hits: []hit{check(0, perMinute)}, allowed: true, states: []bucket.State{ok(0, 10*minute)}},
			{hits: []hit{take(1, perMinute, 4), check(1, perMinute)}, allowed: true, states: []bucket.State{ok(6, 4*minute), ok(6, 4*minute)}},
			{hits: []hit{take(1, perMinute, 3), take(1, perMinute, 3)}, allowed: true, states: []bucket.State{ok(3, 7*minute), ok(0, 10*minute)}},
		},
	},
	// A key that comes with another Limit (a rule whose numbers changed:
	// bucket keys are the rule and values, not the numbers): the tokens it
	// lacks at that moment stay lacking, all of them, also beyond a lowered
	// burst (never clamped to it: nodes that disagree on a limit would
	// otherwise forgive the difference at each switch; see alternations),
	// and the bucket refills at the new rate from then on. The first hit
	// under the new Limit converts the bucket, also when it is refused or
	// only checks.
	{
		name: "limit raised: spent stays spent",
		calls: []call{
			{hits: []hit{take(0, threePerDay, 3)}, allowed: true, states: []bucket.State{ok(0, day)}},
			// 3 spent of 4: exactly one more.
			{hits: []hit{take(0, fourPerDay, 1)}, allowed: true, states: []bucket.State{ok(0, day)}},
			{hits: []hit{take(0, fourPerDay, 1)}, allowed: false, states: []bucket.State{no(0, 6*time.Hour, day)}},
			// A bucket never drained is full under any limit.
			{hits: []hit{check(1, threePerDay), check(1, fourPerDay)}, allowed: true, states: []bucket.State{ok(3, 0), ok(4, 0)}},
		},
	},
	{
		name:    "limit lowered: refused until the excess refills, spent stays spent",
		stretch: 2,
		calls: []call{
			{hits: []hit{take(0, fourPerDay, 3)}, allowed: true, states: []bucket.State{ok(1, 18*time.Hour)}},
			// 3 spent of 2: a token once 2 refilled, in 24 hours.
			{hits: []hit{take(0, twoPerDay, 1)}, allowed: false, states: []bucket.State{no(0, day, 36*time.Hour)}},
			// Nothing forgiven: back at 4/day, still 3 spent.
			{hits: []hit{check(0, fourPerDay)}, allowed: true, states: []bucket.State{ok(1, 18*time.Hour)}},
		},
	},
	{
		name:    "limit lowered: the bucket refills at the new rate",
		stretch: 2,
		calls: []call{
			{hits: []hit{take(0, fourFast, 2)}, allowed: true, states: []bucket.State{ok(2, 200*ms)}},
			// 2 spent of 2 at 200ms a token.
			{hits: []hit{take(0, twoFast, 1)}, allowed: false, states: []bucket.State{no(0, 200*ms, 400*ms)}},
			// At the old rate the bucket would hold 3 by now.
			{advance: 100 * ms, hits: []hit{take(0, twoFast, 1)}, allowed: false, states: []bucket.State{no(0, 100*ms, 300*ms)}},
			{advance: 100 * ms, hits: []hit{take(0, twoFast, 1)}, allowed: true, states: []bucket.State{ok(0, 400*ms)}},
			{hits: []hit{take(0, twoFast, 1)}, allowed: false, states: []bucket.State{no(0, 200*ms, 400*ms)}},
		},
	},
	{
		// A fraction of a token converts too: 2.5 tokens lacking at 200ms
		// a token are 2.5 lacking at 100ms a token.
		name: "limit changed: a fraction of a token converts",
		calls: []call{
			{hits: []hit{take(0, halfFast, 3)}, allowed: true, states: []bucket.State{ok(0, 600*ms)}},
			{advance: 100 * ms, hits: []hit{check(0, fast)}, allowed: true, states: []bucket.State{ok(0, 250*ms)}},
			// 1 lacking 150ms later: a token edge, which lag only moves away from.
			{advance: 150 * ms, hits: []hit{take(0, fast, 1)}, allowed: true, states: []bucket.State{ok(1, 200*ms)}},
		},
	},
	{
		name: "burst raised alone: spent stays spent",
		calls: []call{
			{hits: []hit{take(0, perMinute, 10)}, allowed: true, states: []bucket.State{ok(0, 10*minute)}},
			{hits: []hit{check(0, bigBurst)}, allowed: true, states: []bucket.State{ok(10, 10*minute)}},
			{hits: []hit{take(0, bigBurst, 11)}, allowed: false, states: []bucket.State{no(10, minute, 10*minute)}},
			{hits: []hit{take(0, bigBurst, 10)}, allowed: true, states: []bucket.State{ok(0, 20*minute)}},
		},
	},
	{
		name: "burst lowered alone: spent stays spent",
		calls: []call{
			{hits: []hit{take(0, perMinute, 6)}, allowed: true, states: []bucket.State{ok(4, 6*minute)}},
			// 6 spent of 4: in debt until 2 refilled, a token once 3 did.
			{hits: []hit{check(0, smallBurst)}, allowed: false, states: []bucket.State{no(0, 2*minute, 6*minute)}},
			{hits: []hit{take(0, smallBurst, 1)}, allowed: false, states: []bucket.State{no(0, 3*minute, 6*minute)}},
			// Nothing forgiven: back at burst 10, still 6 spent.
			{hits: []hit{check(0, perMinute)}, allowed: true, states: []bucket.State{ok(4, 6*minute)}},
		},
	},
	{
		// Calls alternating between two limits of one rule, as on nodes
		// that disagree on it: the bucket keeps every token taken under
		// either, so the smaller burst's node takes nothing while the
		// larger's took more than it allows. (The alternations assert the
		// bound over many such calls.)
		name:    "disagreeing limits: the smaller limit forgives nothing",
		stretch: 2,
		calls: []call{
			{hits: []hit{take(0, perMinute, 10)}, allowed: true, states: []bucket.State{ok(0, 10*minute)}},
			// 10 spent of 5 at 2 minutes a token: a token once 6 refilled.
			{hits: []hit{take(0, halfPerMinute, 1)}, allowed: false, states: []bucket.State{no(0, 12*minute, 20*minute)}},
			{hits: []hit{take(0, perMinute, 1)}, allowed: false, states: []bucket.State{no(0, minute, 10*minute)}},
			{hits: []hit{take(0, smallBurst, 1)}, allowed: false, states: []bucket.State{no(0, 7*minute, 10*minute)}},
			{hits: []hit{take(0, perMinute, 1)}, allowed: false, states: []bucket.State{no(0, minute, 10*minute)}},
		},
	},
	{
		name:    "period changed: spent stays spent, refilling at the new rate",
		stretch: 6,
		calls: []call{
			{hits: []hit{take(0, perMinute, 4)}, allowed: true, states: []bucket.State{ok(6, 4*minute)}},
			// 4 spent at 6 minutes a token.
			{hits: []hit{check(0, tenAnHour)}, allowed: true, states: []bucket.State{ok(6, 24*minute)}},
			{hits: []hit{take(0, tenAnHour, 6)}, allowed: true, states: []bucket.State{ok(0, time.Hour)}},
			{hits: []hit{take(0, tenAnHour, 1)}, allowed: false, states: []bucket.State{no(0, 6*minute, time.Hour)}},
		},
	},
	// Post-charges (Overdraw): usage that already happened is recorded
	// even past the limit, into debt, at most one burst deep; checks and
	// takes are refused until the debt refilled.
	{
		name: "charge: past the limit into debt",
		calls: []call{
			{hits: []hit{take(0, perMinute, 8)}, allowed: true, states: []bucket.State{ok(2, 8*minute)}},
			// 13 lacking of 10: a charge of 5 fits once 8 refilled.
			{hits: []hit{charge(take(0, perMinute, 5))}, allowed: true, states: []bucket.State{no(0, 8*minute, 13*minute)}},
			{hits: []hit{check(0, perMinute)}, allowed: false, states: []bucket.State{no(0, 3*minute, 13*minute)}},
			{hits: []hit{take(0, perMinute, 1)}, allowed: false, states: []bucket.State{no(0, 4*minute, 13*minute)}},
			// A charge that fits is an allowed take.
			{hits: []hit{charge(take(1, perMinute, 4))}, allowed: true, states: []bucket.State{ok(6, 4*minute)}},
		},
	},
	{
		// One huge charge locks the key out for at most one burst's refill.
		name: "charge: the debt is at most one burst",
		calls: []call{
			{hits: []hit{charge(take(0, perMinute, 1000))}, allowed: true, states: []bucket.State{no(0, 20*minute, 20*minute)}},
			{hits: []hit{check(0, perMinute)}, allowed: false, states: []bucket.State{no(0, 10*minute, 20*minute)}},
			{hits: []hit{charge(take(0, perMinute, 1))}, allowed: true, states: []bucket.State{no(0, 11*minute, 20*minute)}},
		},
	},
	{
		name: "charge: the debt refills",
		calls: []call{
			{hits: []hit{take(0, fast, 3)}, allowed: true, states: []bucket.State{ok(0, 300*ms)}},
			{hits: []hit{charge(take(0, fast, 2))}, allowed: true, states: []bucket.State{no(0, 400*ms, 500*ms)}},
			{advance: 100 * ms, hits: []hit{check(0, fast)}, allowed: false, states: []bucket.State{no(0, 100*ms, 400*ms)}},
			{advance: 200 * ms, hits: []hit{check(0, fast)}, allowed: true, states: []bucket.State{ok(1, 200*ms)}},
		},
	},
	{
		// A charge neither blocks the call's takes nor is undone when
		// they are refused.
		name: "charge: applied in a refused call",
		calls: []call{
			{hits: []hit{take(1, perMinute, 10)}, allowed: true, states: []bucket.State{ok(0, 10*minute)}},
			{hits: []hit{charge(take(0, perMinute, 3)), take(1, perMinute, 1)}, allowed: false, states: []bucket.State{ok(7, 3*minute), no(0, minute, 10*minute)}},
			{hits: []hit{check(0, perMinute), check(1, perMinute)}, allowed: true, states: []bucket.State{ok(7, 3*minute), ok(0, 10*minute)}},
		},
	},
	{
		// The bound never lowers what a bucket lacks: 4 lacking of 4/day
		// met under 1/day (bound 2) stay 4 lacking.
		name:    "charge: the bound forgives nothing of a converted bucket",
		stretch: 4,
		calls: []call{
			{hits: []hit{take(0, fourPerDay, 4)}, allowed: true, states: []bucket.State{ok(0, day)}},
			{hits: []hit{charge(take(0, onePerDay, 1))}, allowed: true, states: []bucket.State{no(0, 4*day, 4*day)}},
			{hits: []hit{check(0, fourPerDay)}, allowed: true, states: []bucket.State{ok(0, day)}},
		},
	},
	{
		name:  "no hits",
		calls: []call{{hits: nil, allowed: true, states: []bucket.State{}}},
	},
}
