// Package descriptors holds sluice's rule tree: the YAML rule-file model (a
// superset of envoyproxy/ratelimit's), its validation, the matching of request
// descriptors against the tree, and the derivation of token-bucket keys.
//
// It is a leaf package: it imports no other sluice package, no gRPC and no
// Redis client, so backends and the service can both depend on it. Everything
// it builds is immutable after loading and safe for concurrent use.
package descriptors
