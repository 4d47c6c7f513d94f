package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/sluice-rls/sluice/backend/lease"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/internal/redistest"
)

// BenchmarkFromLease is the leased layer's hot path: a decision of three
// keys answered from the node's leases (limits far above the load, a
// period that never ends), in parallel.
func BenchmarkFromLease(b *testing.B) {
	srv := redistest.Start(b)
	l, _ := newLimiter(b, srv, lease.Options{Clock: clockwork.NewFakeClock(), MaxLease: 1 << 40})
	b.ReportAllocs()
	lim := bucket.Limit{Requests: 1 << 40, Period: time.Second, Burst: 1 << 40}
	hits := []bucket.Hit{take(bucket.SumKey([]byte("a")), lim, 1), take(bucket.SumKey([]byte("b")), lim, 1), take(bucket.SumKey([]byte("c")), lim, 1)}
	b.RunParallel(func(pb *testing.PB) {
		states := make([]bucket.State, len(hits))
		for pb.Next() {
			if _, err := l.Hit(context.Background(), hits, states); err != nil {
				b.Fatal(err)
			}
		}
	})
}
