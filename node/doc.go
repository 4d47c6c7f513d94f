// Package node assembles and runs one sluice node: from one Options value
// it builds the rule store (files or xDS), the local and global limiting
// layers with the fail-open switch in front of Redis, runtime overrides
// and the adaptive limits that write them, the emergency channel, the
// audit trail and tracing, and serves them on the gRPC listener
// (RateLimitService v3 and grpc.health.v1), the public HTTP listener
// (/healthcheck, /metrics, /rlconfig) and the admin listener (/json,
// /usage, /usage/top, /overrides, /debug/pprof/). It owns what only a
// running node needs: admin authentication, certificate reloading, gRPC
// connection limits, the node count of the fallback share, and the
// graceful drain when its context ends.
//
// Node.Run reads as the list of its steps, each in the file named after
// it: the rules (rules.go, xds.go), tracing (tracing.go), the limiting
// layers (backends.go, redis.go), the emergency channel (emergency.go),
// the overrides (override_admin.go), the adaptive limits (adaptive.go),
// the service (service.go), the servers and their muxes (serve.go,
// grpc.go, http.go), the listeners (listen.go), serving (serve.go) and
// the drain (shutdown.go).
//
// Options are what `rls serve`'s flags set; the cmd/rls/flags package
// registers its flags onto their fields. Groups of options that another
// package uses are that package's type, carried whole: service.Settings.
package node
