package redis_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: the
// batcher's writers exit when their queue is empty and at Close, the node
// registry's Run when its context ends, and every test closes its
// go-redis clients (whose pools then stop their goroutines).
//
// The package's internal tests (package redis) and external tests
// (package redis_test) build into one test binary, which may have one
// TestMain: this one covers both.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
