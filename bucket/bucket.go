package bucket

import "time"

// Key identifies one token bucket: 128 bits derived from everything that
// defines it (package descriptors encodes that; SumKey or a NodeHasher
// hashes it), so its length never depends on what a client sends.
type Key [16]byte

// Limit is the shape of one token bucket: Requests tokens refill evenly over
// each Period, and the bucket holds at most Burst tokens. A bucket starts full.
// Requests == 0 means nothing is ever allowed.
type Limit struct {
	Requests uint64        // tokens added per Period
	Period   time.Duration // the unit, times unit_multiplier
	Burst    uint64        // capacity, ≥ 1 when Requests > 0
}

// Hit is one bucket operation of a decision: take Cost tokens from the bucket
// Key shaped by Limit, or with Give set return Cost tokens to it (never above
// Burst). A take of Cost c is allowed when the bucket lacks at most Burst-c
// tokens. So Cost 0 only checks, and is refused only when the bucket is in
// debt: when it lacks more than Burst tokens, which only an Overdraw hit or
// a lowered limit leaves (envoyproxy/ratelimit refuses a hits_addend of 0
// only when its count is above the limit).
//
// An Overdraw hit that is Independent and not a Give is a charge for usage
// that already happened (a post-charge): when the bucket lacks the tokens,
// it is refused and takes them all the same, so that the bucket goes into
// debt, never deeper than Burst tokens below empty (it lacks at most
// 2×Burst), and a charge never lowers what the bucket lacks. Takes and
// checks are then refused until the debt refilled: at most the time Burst
// tokens take to refill. Overdraw on a hit that is not Independent, or on a
// Give, changes nothing.
//
// A decision over several hits is all-or-nothing: tokens are taken only when
// every take is allowed. A hit with Independent set (shadow mode) is decided
// on its own: it takes its tokens when they exist and never blocks the
// others. A Give is never refused and never blocks the others, and it is
// applied whatever the decision: returning tokens is not something to
// refuse (a give to a Limit with Requests 0 does nothing).
//
// The order, which matters when several hits of one call name the same
// Key: first the takes (hits neither Give nor Independent), in call order,
// each against its bucket as the call's earlier takes leave it, and the
// decision is made over them alone, against the buckets as they stood
// before the call; then the Give and Independent hits, one by one in call
// order, whatever that decision, each against its bucket as everything
// before it left it. So a give never makes room for a take of its own call,
// and an independent hit never takes tokens a take of its call needs,
// wherever they stand in the call.
//
// A Key may come with another Limit than its bucket was last written under
// (a rule's numbers changed; keys are a rule and its values, not its
// numbers; or nodes run different limits for one rule). The bucket then
// keeps what was spent, all of it: with debt = TAT - now the time it lacks
// to be full under the old Limit (GCRA's theoretical arrival time, TAT) and
// interval = Period/Requests, it becomes
//
//	TAT' = now + (debt/oldInterval) × newInterval
//
// (a full bucket stays full; fractions of a token convert too), never
// clamped to the new burst: a bucket that took more than a lowered burst
// refuses, Remaining 0, until the excess refilled. It is stored so
// converted whatever the hit's decision, so that it refills at the new rate
// from then on. So 3 spent of 3/day, raised to 4/day, leaves exactly 1; 2
// spent of 4/day, lowered to 2/day, leaves none for 12 hours, and 3 spent
// none for 24. Limiters that alternate between Limits on one key admit at
// most the largest Burst plus the largest rate × the time (buckettest's
// alternations).
type Hit struct {
	Key         Key
	Limit       Limit
	Cost        uint64
	Give        bool
	Independent bool
	// Overdraw makes an Independent take record its Cost even when the
	// bucket lacks it (above).
	Overdraw bool
	// Rule is the rule the hit comes from, opaque here: for the layers
	// that decide by a rule's own settings, each of which asserts it to
	// an interface of its own and treats a Rule that does not implement
	// it as no rule. Nil for a hit without a rule (an Envoy limit
	// override that matched none) or bound for layers that read none;
	// the others ignore it.
	Rule any
}

// State is the answer for one Hit.
type State struct {
	// Allowed reports whether the bucket had the tokens the hit asked for.
	Allowed bool
	// Remaining is the number of whole tokens left after the decision.
	Remaining uint64
	// RetryAfter is, for a refused hit, the time until the bucket as the
	// hit left it allows the hit (lacks at most Burst-Cost tokens), or until
	// it is full when Cost exceeds Burst; zero otherwise.
	RetryAfter time.Duration
	// ResetAfter is the time until the bucket is full again.
	ResetAfter time.Duration
}
