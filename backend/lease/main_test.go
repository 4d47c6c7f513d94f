package lease_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: Run
// returns at Close, and every test closes its go-redis clients.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
