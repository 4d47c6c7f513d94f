// Package memory keeps token buckets in process memory. sluice uses it for
// the per-node local layer, for global rules when no Redis is configured, and
// as the fallback that keeps enforcing global rules while Redis is down.
//
// A Limiter holds one bucket per bucket.Key and decides a call's hits
// all-or-nothing, in the contract's order (bucket.Hit, Limiter.HitAt): the
// takes first, applied as they are decided and undone when one is refused,
// then the gives and independent hits, so that it answers a call that hits
// one key several times as backend/redis does. Buckets refill continuously:
// Requests tokens per Period, up to Burst, starting full.
//
// # Representation
//
// Each bucket is stored in GCRA form, as the instant it will be full again
// (its theoretical arrival time), kept to a fraction of a nanosecond in
// integers. Tokens are derived from it on demand with 128-bit arithmetic, so
// decisions are exact for integer limits and never drift, from one token a
// year to billions a second. A full bucket behaves exactly like an absent
// one, so the Limiter keeps only partly drained buckets, and telling that one
// has refilled (and may be evicted) is one comparison.
//
// A bucket records the Limit it was last written under. A hit under another
// Limit (a rule's numbers changed; a key is a rule and its values, not its
// numbers) first converts it, as bucket.Hit documents: what was spent stays
// spent, also beyond a lowered burst. The conversion is stored before the hit
// is decided, so it holds whatever the decision.
//
// # Time
//
// Nothing here reads the wall clock except through Options.Clock (a
// clockwork.Clock): HitAt and EvictAt take the time as an argument, Hit
// reads the injected clock and Run waits on its timers, so tests drive both
// with a fake clock.
//
// # Memory
//
// A bucket is 40 bytes (its TAT and the Limit it was last written under,
// which a changed limit converts from), kept in its shard's slab; the
// shard's map holds its 16-byte key and its 4-byte slot, so that a hit on
// it looks the key up once. With the map's slack a full table costs 83
// bytes a bucket of live heap (BenchmarkBucketMemory: 87 MB for
// DefaultMaxBuckets), and a process holding it grows to about twice that
// between collections. Options.MaxBuckets bounds their number. Neither Go
// maps nor the slabs shrink, so memory stays at its high-water mark, which
// MaxBuckets bounds.
//
// # Eviction
//
// Only full buckets are dropped: Limiter.Run drops them periodically, and an
// insert into a full shard takes the room of one. When a shard is full of
// partly drained buckets, a hit that needs a new bucket is refused rather
// than forgetting what another key has spent (see Options.MaxBuckets), and
// Limiter.FullRefusals counts it.
//
// # Concurrency
//
// All methods of a Limiter are safe for concurrent use. Buckets are spread
// over up to 64 mutex-guarded shards by key hash; a call locks the shards its
// hits need in ascending order, decides, and unlocks, with no allocation and
// no I/O.
package memory
