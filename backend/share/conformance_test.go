package share_test

import (
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/sluice-rls/sluice/backend/memory"
	"github.com/sluice-rls/sluice/backend/share"
	"github.com/sluice-rls/sluice/bucket/buckettest"
)

// TestConformance runs the bucket contract's suite through the layer in
// front of backend/memory on a fake clock: hits without a share must pass
// through with every answer unchanged.
func TestConformance(t *testing.T) {
	t.Parallel()
	buckettest.Run(t, buckettest.Harness{
		New: func(t *testing.T) buckettest.Subject {
			clock := clockwork.NewFakeClockAt(time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC))
			l := share.New(share.Options{
				Inner:      memory.New(memory.Options{Clock: clock}),
				Membership: &members{n: 3, ok: true},
				Clock:      clock,
			})
			return buckettest.Subject{Limiter: l, Advance: clock.Advance, Now: clock.Now}
		},
	})
}
