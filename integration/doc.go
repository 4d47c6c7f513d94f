// Package integration holds sluice's black-box tests: they build the rls
// binary, start it (and real redis-server processes) on free loopback ports,
// and talk to it over gRPC and HTTP as Envoy and operators do.
//
// The tests carry the build tag "integration"; `make test` runs them.
package integration
