package node

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when goroutines outlive its tests:
// certificate watchers, connection counters and admin servers must stop
// with their tests.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
