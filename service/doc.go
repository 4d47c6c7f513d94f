// Package service answers Envoy's RateLimitService (envoy.service.ratelimit.v3)
// and the equivalent HTTP /json endpoint.
//
// For each request it strips the gray marker, matches every descriptor against
// the current rule set (RuleSource), then decides in two layers: the per-node
// local layer first, all-or-nothing over the request's descriptors, then the
// global layer in one call; when the global layer refuses, the local tokens
// are given back. It builds one status per descriptor, the overall code and,
// on OVER_LIMIT, the retry headers and a JSON body.
//
// Usage (GET /usage) reads the buckets a request would be decided by with
// check-only hits, spending nothing; the refused descriptors of OVER_LIMIT
// answers feed a bounded top-K of refused values per rule (GET /usage/top).
//
// It sees both layers only through the bucket.Limiter contract: it never
// knows which backend answers, nor whether the fail-open switch (package
// fallback) stands in front of one; a Decision says who answered. What else
// it reads, it reads through interfaces of its own: the rules (RuleSource),
// the runtime overrides' compiled table (OverrideSource) and the emergency
// channel's secrets (EmergencySecrets). A Server is safe for concurrent use.
package service
