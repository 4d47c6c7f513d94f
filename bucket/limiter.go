package bucket

import "context"

// Limiter decides a set of hits all-or-nothing, as Hit documents.
//
// Hit writes one State per hit into states (at least as long as hits) and
// returns the Decision. An error means the limiter could not decide (states
// are then undefined): the caller fails open.
//
// Shared reports whether other processes use the same buckets (Redis): then
// every node must derive the same Key for a bucket (SumKey), while buckets
// that never leave the process may use the faster NodeHasher.
type Limiter interface {
	Hit(ctx context.Context, hits []Hit, states []State) (Decision, error)
	Shared() bool
}

// Answer says who answered a call of Limiter.Hit.
type Answer uint8

const (
	// Decided: the limiter decided, and the states are valid.
	Decided Answer = iota
	// Fallback: a fallback decided in the limiter's place while it is
	// failing (package fallback); the states are valid.
	Fallback
	// Skipped: nobody decided, and this layer is not enforced for the call
	// (--redis-failure local); the states are not valid, and the caller
	// decides by the other layers.
	Skipped
	// Bypassed: nobody decided, and the whole request is to be allowed,
	// whatever the other layers say (--redis-failure allow); the states
	// are not valid.
	Bypassed
)

// Decision is a Limiter's answer to one call of Hit.
type Decision struct {
	// Allowed reports whether every hit that is neither Give nor
	// Independent had its tokens, and took them. It is true when Answer is
	// Skipped or Bypassed.
	Allowed bool
	// Answer says who decided.
	Answer Answer
}
