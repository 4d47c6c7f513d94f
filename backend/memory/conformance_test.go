package memory_test

import (
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/sluice-rls/sluice/backend/memory"
	"github.com/sluice-rls/sluice/bucket/buckettest"
)

// TestConformance runs the bucket contract's suite on a fake clock: every
// duration is exact to the nanosecond.
func TestConformance(t *testing.T) {
	t.Parallel()
	buckettest.Run(t, buckettest.Harness{
		New: func(t *testing.T) buckettest.Subject {
			clock := clockwork.NewFakeClockAt(time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC))
			return buckettest.Subject{
				Limiter: memory.New(memory.Options{Clock: clock}),
				Advance: clock.Advance,
				Now:     clock.Now,
			}
		},
	})
}
