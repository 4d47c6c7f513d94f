// Package fallback is sluice's fail-open switch: a bucket.Limiter that
// wraps the cluster-wide layer (the primary, backend/redis) and, while the
// primary fails, answers in its place by the failure mode (--redis-failure):
// enforcing this node's share of each global limit in memory, skipping the
// global layer, allowing everything, or refusing. A background probe finds
// the primary answering again and switches back.
//
// It owns what belongs to that switch: the failure modes, the evidence rule
// (errors switch at once; timeouts only when calls have stalled and a
// generous confirming probe fails too), the probe and its backoff, the
// share charged with every hit the node sends to the primary, the Redis
// and fallback metrics (docs/metrics.md) and the fallback's trace span. It
// knows no backend: the caller passes the primary's error kinds
// (backend/redis.ErrorKind) and probe (backend/redis.Limiter.Ping).
//
// "Fallback" in sluice always means this switch; "failover" means Redis' own
// (Sentinel or Cluster) promotion of a replica.
package fallback
