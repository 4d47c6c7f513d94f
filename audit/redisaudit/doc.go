// Package redisaudit keeps the audit trail in a Redis stream: Writer is an
// audit.Recorder that appends each event to a capped stream (XADD … MAXLEN ~),
// and Read returns the newest events (XREVRANGE), for `rls audit`.
//
// A stream is one key, so a single Redis, Sentinel and Redis Cluster all
// hold it the same way. The package takes go-redis through the small
// interfaces it calls (goredis.UniversalClient fits), as backend/redis
// does; cmd/rls builds the client from --redis.
//
// Writer never blocks the reload or override that records an event: Record
// puts the event in a small queue and returns; one goroutine (Run, owned
// by the caller) writes the queue to Redis, each write under its own
// timeout. A full queue drops the event and counts it; the structured log
// (audit.Log, next to the Writer in an audit.Multi) still has it.
package redisaudit
