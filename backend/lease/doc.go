// Package lease is sluice's leased global layer: a bucket.Limiter that
// decides hits of leased rules from tokens the node took ahead of time from
// their Redis buckets (leases), and passes every other hit to the exact
// layer (backend/redis). Redis leaves the per-request path: a request waits
// on Redis only when its node holds too few tokens for one of its keys.
//
// The guarantee: a lease removes its tokens from the Redis bucket before
// the node spends any of them, a refused request puts the tokens it
// reserved back into the node's lease, and a give-back restores at most
// the unspent tokens, or nothing when the bucket was converted to another
// limit since they were leased (lease.lua converts a bucket under a
// changed limit as token_bucket.lua does). So the tokens the fleet spends
// from the start are never more than the bucket let out: admitted ≤ burst +
// rate × T, as in exact mode. Gives (is_negative_hits) and give-backs are
// clamped at the burst minus lease.lua's upper bound of the tokens parked
// in leases (grants counted for twice the lease period, a node's pool of
// leases spent within one), so the fleet's bucket, Redis' plus the leases,
// never exceeds the burst through a give. The cost is under-admission: tokens parked in
// one node's lease cannot serve another node for up to one lease period.
// docs/design.md ("Leased global buckets") describes the layer;
// docs/decisions/0003-leases-and-parked-tokens.md gives the proof sketch and
// the reasons for the sizing.
package lease
