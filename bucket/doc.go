// Package bucket is sluice's token-bucket contract: the vocabulary every
// layer of a decision shares (Key, Limit, Hit, State, Decision) and the
// Limiter interface that backend/memory, backend/redis and the fail-open
// switch (package fallback) implement. The service builds Hits from rules
// and asks Limiters; it never needs to know which backend answers.
//
// It is the leaf of sluice's package graph, so that a backend depends on
// this contract alone, not on the rule-file package.
//
// Package buckettest holds the conformance suite: one table of scenarios
// every Limiter must pass.
package bucket
