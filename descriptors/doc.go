// Package descriptors holds sluice's rule tree: the YAML rule-file model (a
// superset of envoyproxy/ratelimit's), its validation, the matching of request
// descriptors against the tree, and the canonical material of token-bucket
// keys (bucket.SumKey or a bucket.NodeHasher hashes it).
//
// Everything it builds is immutable after loading and safe for concurrent
// use.
//
// # Loading
//
// Parse decodes and validates one file; New builds a Config from parsed
// files, checking what spans files (duplicate domains, replaces, rule
// paths). Both report every problem at once as *Error values joined with
// errors.Join, each "file:line:column: reason". A reload builds a new
// Config and swaps it in only when New succeeds.
//
// What envoyproxy/ratelimit loads is never an error, unless loading it
// would let a request reach a rule written for another key (two rules
// whose paths collide): it loads with the peer's meaning, and
// Config.Warnings lists what sluice finds suspect, as *Error values too.
//
// # Rule files
//
// Every field of envoyproxy/ratelimit's format keeps its meaning: domain,
// descriptors (key, value, rate_limit, descriptors, shadow_mode,
// detailed_metric, value_to_metric, share_threshold) and rate_limit (unit,
// requests_per_unit, name, replaces, unlimited). sluice adds, in
// rate_limit: burst (bucket capacity, default requests_per_unit),
// unit_multiplier (the period is unit × multiplier, default 1, as Envoy's
// proto field), and local (a per-node layer with its own unit,
// requests_per_unit, unit_multiplier and burst). A rate_limit with only
// local is a local-only rule. On a descriptor it adds protected (runtime
// overrides may tighten the rule, never loosen it) and utilisation (the
// rule reports the tokens each tenant takes, Rule.Tenant). Numbers are whole and
// fit uint32, as in Envoy's protos; a bucket must refill within 100 years.
//
// # Matching
//
// See Domain.Match: level-exact; the exact value, else the first '*'
// pattern in file order, else key-only (as envoyproxy/ratelimit); no
// backtracking across levels.
//
// # Rule paths
//
// Rule.Path names a rule for metrics, /rlconfig and reload diffs: the
// domain, then one element per level, each key or key_value (the value
// being the exact value or the pattern as written), joined by ".", e.g.
// "edge.route_/api/orders.user_id". Bucket keys never use it: see
// BucketKey for their collision-free encoding.
package descriptors
