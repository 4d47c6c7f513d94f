// Package override holds runtime overrides: operator changes to how the
// rules decide, made without touching rule files and applied by every node
// within a second (docs/operating-limits.md).
//
// An Override scales a rule, a domain or everything by a factor, sets a
// rule's limit, blocks a descriptor value (limit 0), bypasses (allow) or
// shadows a rule or domain. Each has a reason, an author and an optional
// expiry; one that loosens the limits (allow, shadow, a scale above 1, a
// higher limit) needs an expiry within the Manager's MaxLoosenExpiry. Rules marked
// protected refuse bypass, scale above 1 and higher limits, when an
// override is set and when it is applied.
//
// Compile turns the active overrides and a rule set into a Table, the
// immutable form the service reads: one map lookup per matched rule, no
// lock. A Manager keeps the current Table behind an atomic pointer, reads
// the overrides from a Store (a file per node, or Redis through package
// override/redisstore), re-reads on every change notification and at a
// fixed interval, drops expired overrides on time on its clock, and records
// every change with an audit.Recorder. The package does not know Redis:
// the Redis store is package override/redisstore.
package override
