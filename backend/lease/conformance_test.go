package lease_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/backend/lease"
	"github.com/sluice-rls/sluice/backend/leaseproto"
	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/bucket/buckettest"
	"github.com/sluice-rls/sluice/internal/redistest"
)

// TestConformance runs the bucket contract's suite on the leased layer over
// a real redis-server, every hit leased, on one node: leases of half of
// what is left (share 2 × 1 node), so most scenarios decide some calls
// from the lease and some in Redis, and the states are the layer's
// estimate, which on one node is exact. As backend/redis's suite, the
// buckets run on Redis' clock: Advance waits real time, and the lag is
// measured (buckettest.Run). The layer's own clock is real too, and it
// dates Redis' replies at their call's send (DatesAtCall).
//
// "eager" leases from a key's first decision; "default" (rls serve's
// setting) from its second, so that its first is Redis' exact decision.
func TestConformance(t *testing.T) {
	srv := redistest.Start(t)
	for _, eager := range []bool{true, false} {
		name := map[bool]string{true: "eager", false: "default"}[eager]
		t.Run(name, func(t *testing.T) {
			buckettest.Run(t, buckettest.Harness{
				New: func(t *testing.T) buckettest.Subject {
					c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
					t.Cleanup(func() { _ = c.Close() })
					l, _ := newLimiterOn(t, c, lease.Options{EagerLeases: eager})
					return buckettest.Subject{Limiter: l, Advance: time.Sleep, Now: time.Now}
				},
				Resolution:  time.Microsecond,
				DatesAtCall: true,
			})
		})
	}
}

// TestConformanceCluster runs the suite on a real 3-master Redis Cluster,
// eager leases: a decision's keys lie on several masters, each decided in
// its own call, and a refusal on one master gives back what the others
// took.
func TestConformanceCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	buckettest.Run(t, buckettest.Harness{
		New: func(t *testing.T) buckettest.Subject {
			c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs()})
			t.Cleanup(func() { _ = c.Close() })
			l, _ := newLimiterOn(t, c, lease.Options{EagerLeases: true})
			return buckettest.Subject{Limiter: l, Advance: time.Sleep, Now: time.Now}
		},
		Resolution:  time.Microsecond,
		DatesAtCall: true,
	})
}

// newLimiter returns a leased layer over srv, every hit leased unless
// its rule says exact, its Redis side counting its calls, with its
// own key prefix; Close runs at cleanup. opts.Exact, when nil, is the
// exact layer on the same Redis. opts.Period, when 0, is an hour: long
// enough for the tests' slow limits to be leased (a lease is at most what
// the limit refills in one period) and for no period to end unless a test
// moves the clock.
func newLimiter(t testing.TB, srv *redistest.Server, opts lease.Options) (*lease.Limiter, *counting) {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	opts.EagerLeases = true // the tests count on a key's first lease
	return newLimiterOn(t, c, opts)
}

// newLimiterOn is newLimiter on client c, which the caller closes, with
// opts.EagerLeases as given.
func newLimiterOn(t testing.TB, c goredis.UniversalClient, opts lease.Options) (*lease.Limiter, *counting) {
	t.Helper()
	r := redisbackend.New(redisbackend.Options{
		Client:    c,
		Prefix:    strings.NewReplacer("/", "-", "{", "", "}", "").Replace(t.Name()),
		Timeout:   time.Second,
		CacheSize: -1,
	})
	t.Cleanup(r.Close)
	cr := &counting{Limiter: r}
	opts.Leaser = cr
	if opts.Period == 0 {
		opts.Period = time.Hour
	}
	if opts.Exact == nil {
		opts.Exact = r
	}
	opts.Default = lease.Leased
	l := lease.New(opts)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	// Load the script before the scenario's first call, so that its lag
	// is the decisions' alone.
	if err := r.Lease(context.Background(), nil, nil); err != nil {
		t.Fatal(err)
	}
	return l, cr
}

// counting is the Redis side of a leased layer, counting its lease calls.
type counting struct {
	*redisbackend.Limiter
	calls atomic.Int64
}

func (c *counting) Lease(ctx context.Context, ops []leaseproto.Op, out []leaseproto.Reply) error {
	c.calls.Add(1)
	return c.Limiter.Lease(ctx, ops, out)
}

// inRedis returns the whole tokens Redis' leased bucket k holds, without
// taking any.
func (c *counting) inRedis(t *testing.T, k bucket.Key, lim bucket.Limit) uint64 {
	t.Helper()
	out := make([]leaseproto.Reply, 1)
	op := leaseproto.Op{Key: k, Limit: lim, Decision: 1, Kind: leaseproto.Independent}
	if err := c.Limiter.Lease(context.Background(), []leaseproto.Op{op}, out); err != nil {
		t.Fatal(err)
	}
	return out[0].Remaining
}
