package fallback_test

import (
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/sluice-rls/sluice/backend/memory"
	"github.com/sluice-rls/sluice/bucket/buckettest"
	"github.com/sluice-rls/sluice/fallback"
)

// TestConformance runs the bucket contract's suite through the switch while
// its primary answers: it must pass every call, and every answer, through
// unchanged. The primary is backend/memory on the suite's fake clock.
func TestConformance(t *testing.T) {
	t.Parallel()
	buckettest.Run(t, buckettest.Harness{
		New: func(t *testing.T) buckettest.Subject {
			clock := clockwork.NewFakeClockAt(time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC))
			l := fallback.New(fallback.Options{
				Primary: memory.New(memory.Options{Clock: clock}),
				Share:   memory.New(memory.Options{Clock: clock}),
				Nodes:   func() int { return 1 },
				Mode:    fallback.Share,
				Clock:   clock,
			})
			t.Cleanup(l.Close)
			return buckettest.Subject{Limiter: l, Advance: clock.Advance, Now: clock.Now}
		},
	})
}
