package lease_test

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/sluice-rls/sluice/backend/lease"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/internal/cputime"
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

// BenchmarkLeasedRules is a request's hits carrying their rules as the
// service sets them (*descriptors.Rule, whose consistency the layer reads
// per hit), on a layer whose Exact is a real redis-server: "leased", three
// hot keys of leased rules, all answered from the node's leases (no Redis
// call); "mixed", the same three and a hit of an exact rule, decided in
// Redis on every call. Serial; cpu-ns/op is the process' CPU time per
// decision, the Redis client's goroutines included.
func BenchmarkLeasedRules(b *testing.B) {
	leased := &descriptors.Rule{Consistency: "leased"}
	exact := &descriptors.Rule{Consistency: "exact"}
	lim := bucket.Limit{Requests: 1 << 40, Period: time.Second, Burst: 1 << 40}
	hot := make([]bucket.Hit, 3)
	for i, k := range []string{"remote_address", "user_id", "route_user_id"} {
		hot[i] = bucket.Hit{Key: bucket.SumKey([]byte(k)), Limit: lim, Cost: 1, Rule: leased}
	}
	for _, bc := range []struct {
		name string
		hits []bucket.Hit
	}{
		{"leased", hot},
		{"mixed", append(hot[:3:3], bucket.Hit{Key: bucket.SumKey([]byte("tenant")), Limit: lim, Cost: 1, Rule: exact})},
	} {
		b.Run(bc.name, func(b *testing.B) {
			srv := redistest.Start(b)
			l, r := newLimiter(b, srv, lease.Options{Clock: clockwork.NewFakeClock(), MaxLease: 1 << 40})
			ctx := context.Background()
			states := make([]bucket.State, len(bc.hits))
			decide := func() {
				if d, err := l.Hit(ctx, bc.hits, states); err != nil || !d.Allowed {
					b.Fatalf("Hit: %+v %v", d, err)
				}
			}
			decide() // the leases
			leaseCalls := r.calls.Load()
			b.ReportAllocs()
			cpu0 := cputime.Process()
			for b.Loop() {
				decide()
			}
			cputime.ReportPerOp(b, cpu0)
			if n := r.calls.Load() - leaseCalls; n != 0 {
				b.Fatalf("%d lease calls: not answered from the leases", n)
			}
		})
	}
}
