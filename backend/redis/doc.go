// Package redis is sluice's global layer: cluster-wide token buckets held in
// Redis and decided atomically by one Lua script, token_bucket.lua, run with
// EVALSHA through go-redis (EVAL once after a Redis restart or failover
// flushed the script cache).
//
// The rest of sluice imports it as redisbackend; inside this package go-redis
// is goredis.
//
// A Limiter decides the hits of one request all-or-nothing, with Redis' own
// clock, under a deadline for every Redis call. Against Redis Cluster it runs
// one script per master, concurrently, and gives back the tokens of the
// masters that took them when another master refused. A bucket Redis
// reported empty is remembered on the node until its next token is due, so
// a key under attack costs no Redis traffic. Errors are classified
// (ErrorKind) so the caller can count them and fail open.
//
// Concurrent requests share round trips without waiting for each other: a
// request that finds its Redis server idle is sent at once; requests that
// arrive while calls to it are in flight queue, and the next call carries
// them all, each its own all-or-nothing decision, in one script call.
// Every caller still waits at most the Timeout. Writer goroutines
// live only while there is queued work; Close stops the Limiter.
//
// Deciding and batching are apart. The Limiter (limiter.go) decides: it
// answers what the node can, splits the rest into parts, one per script
// call, gives tokens back after a refusal across masters, and fills the
// cache. The batcher (batch.go) shares round trips: per-server queues and
// their writers, which know Redis only as a function that sends parts in
// script calls; the sender (call.go) is that function. Between them travel
// requests and parts (request.go). The rest: the script's binary protocol
// (script.go), bucket key layout (keys.go), routing and cluster slots
// (route.go), the empty-bucket cache (cache.go), Ping's probe (probe.go),
// errors (errors.go), spans (trace.go), --redis parsing (url.go) and the
// node registry (nodes.go).
//
// A Limiter is safe for concurrent use.
package redis
