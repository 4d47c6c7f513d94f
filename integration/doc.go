// Package integration holds sluice's black-box tests: they build the rls
// binary, start it (and real redis-server processes) on free loopback ports,
// and talk to it over gRPC and HTTP as Envoy and operators do.
//
// Every test owns its processes, ports and files, and calls t.Parallel:
// TestMain runs four at once unless -parallel says otherwise, since most of
// a test's time is waiting on processes and timed load runs. The fault
// tests that measure the server's latency while Redis fails (checkFast) run
// alone, before the others: beside three other tests and a busy machine,
// 1.6% of a node's answers in fallback took 20ms where the bound is 1%.
//
// TestDocCommands (doccommands_test.go) runs the shell commands of README.md
// and docs/operating-limits.md against the built binary, a node and a
// redis-server, and checks the output the docs show.
//
// The tests carry the build tag "integration"; `make test` runs them. One
// check runs without it: TestDocLinks (doclinks_test.go) reads README.md and
// docs/ and fails on a relative link to a missing file or heading.
package integration
