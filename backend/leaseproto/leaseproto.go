// Package leaseproto is the lease protocol between sluice's leased global
// layer (backend/lease) and the store that holds the buckets
// (backend/redis, lease.lua): the ops a node sends in one call and the
// replies it gets. It holds the types alone, so that the layer and the
// store depend on it and not on each other; docs/design.md ("Leased global
// buckets") describes the protocol.
package leaseproto

import (
	"time"

	"github.com/sluice-rls/sluice/bucket"
)

// Kind says what an Op does.
type Kind uint8

const (
	// Take takes Op.Take tokens when Op.Need exist, all-or-nothing with
	// the other Take ops of its decision, then leases up to Op.Extra more.
	Take Kind = iota
	// Give gives Op.Take tokens back: never above the burst minus the
	// tokens the bucket counts as parked in leases (lease.lua's header), so
	// that the fleet's bucket (the store's plus the leases) stays within
	// the burst, as exact mode's.
	Give
	// Independent is a Take decided alone (a shadow-mode or quota hit, or
	// a prefetch with Need 0, refused only in debt and then leasing
	// nothing).
	Independent
	// Return closes a node's pool of leased tokens: it takes the pool's
	// Op.Unpark granted tokens (first granted at Op.Since) out of the
	// bucket's count of parked tokens, then gives back Op.Take tokens
	// leased under Op.Limit as a Give, except that the give does nothing
	// when the bucket was written under another limit since (those tokens
	// are lost, never admitted: the conservative side; a give back under
	// the old limit would switch the bucket back to the old limit's rate).
	Return
)

// Op is one bucket operation of a lease call. Ops with the same Decision
// number next to each other form one decision.
type Op struct {
	Key      bucket.Key
	Limit    bucket.Limit
	Decision uint64
	Kind     Kind
	// Need is how many tokens must exist for a take to be allowed (0: the
	// bucket must not be in debt, lacking more than its burst); Take how
	// many it takes then (Take ≤ Need), or how many a give gives back.
	Need, Take uint64
	// Overdraw, on an Independent op, takes Take tokens also when the
	// take is refused, into debt (bucket.Hit's Overdraw), and leases
	// nothing then.
	Overdraw bool
	// Extra bounds the tokens leased beyond Take once the decision is
	// allowed; they are at most the tokens then left divided by Share.
	Extra, Share uint64
	// Window is the longest that tokens this op leases may stay parked
	// on the node (spent or not): the bucket counts them as parked for at
	// least that long. Zero: until the bucket's value expires.
	Window time.Duration
	// Since and Unpark are a Return's pool: when its first grant was
	// made (Reply.Granted) and how many tokens it was granted in all.
	Since, Unpark uint64
}

// Reply is the store's answer for one Op.
type Reply struct {
	Allowed bool
	// Leased is the number of tokens leased beyond Take.
	Leased uint64
	// Remaining is the number of whole tokens left in the store's bucket.
	Remaining uint64
	// Retry is, for a refused take, the time until Need tokens exist.
	Retry time.Duration
	// Reset is the time until the store's bucket is full, on the store's
	// clock.
	Reset time.Duration
	// Granted is, when Leased > 0, the store's clock at the grant in
	// microseconds: a Return's Since.
	Granted uint64
}
