package share_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/backend/memory"
	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/backend/share"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/internal/redistest"
)

// boundLimit is 20 a second, burst 30; share 0.6.
var boundLimit = bucket.Limit{Requests: 20, Period: time.Second, Burst: 30}

const boundShare = 600_000

// bound returns the most the fleet may admit of boundLimit when its cells
// ran for cells and Redis' part for redis: each part's burst plus its
// rate times its own time (docs/decisions/0021-standing-shares.md).
func bound(cells, redis time.Duration) float64 {
	f := float64(boundShare) / 1e6
	rate := float64(boundLimit.Requests) / boundLimit.Period.Seconds()
	return float64(boundLimit.Burst) + f*rate*cells.Seconds() + (1-f)*rate*redis.Seconds()
}

// One node over a memory layer on the same fake clock, far above the
// limit: it admits at most burst + rate × T, and nearly all of it but its
// cells' burst, since they start empty.
func TestBoundOneNode(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	l := share.New(share.Options{Inner: memory.New(memory.Options{Clock: clock}), Membership: &members{n: 1, ok: true}, Clock: clock})
	hit := []bucket.Hit{{Key: key("a"), Limit: boundLimit, Cost: 1, Rule: shareRule(boundShare)}}
	st := make([]bucket.State, 1)
	admitted := 0
	const steps, step = 200, 50 * time.Millisecond
	for s := range steps {
		if s > 0 {
			clock.Advance(step)
		}
		for range 5 {
			if d, _ := l.Hit(context.Background(), hit, st); d.Allowed {
				admitted++
			}
		}
	}
	T := (steps - 1) * step
	most := bound(T, T)
	cells := float64(boundShare) / 1e6 * float64(boundLimit.Burst)
	if float64(admitted) > most || float64(admitted) < 0.95*(most-cells) {
		t.Errorf("admitted %d over %v, want at most %.0f (burst + rate × T) and at least 95%% of it less the cells' %.0f", admitted, T, most, cells)
	}
	t.Logf("admitted %d over %v, bound %.0f", admitted, T, most)
}

// fleetNode is one simulated node: its share layer, over its own client
// of one real Redis.
type fleetNode struct {
	l      *share.Limiter
	member *members
	active bool // sends requests
}

// Four simulated nodes share one real redis-server (exact buckets), their
// cells on one fake clock, far above the limit: three start admitted; a
// fourth sends requests while not admitted (Redis' part only), then the
// three shrink to n = 4 and it is admitted; later one stops, and the
// others grow back to n = 3 only a registration's lifetime (3 s) later.
// What they admit stays within each part's burst plus its rate times its
// own clock's time (the cells' fake one, Redis' real one).
func TestBoundNodesOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	prefix := strings.NewReplacer("/", "-").Replace(t.Name())
	var redisCalls atomic.Int64
	nodes := make([]*fleetNode, 4)
	for i := range nodes {
		c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
		t.Cleanup(func() { _ = c.Close() })
		r := redisbackend.New(redisbackend.Options{Client: c, Prefix: prefix, Timeout: 5 * time.Second, CacheSize: -1})
		t.Cleanup(r.Close)
		m := &members{n: 3, ok: i < 3}
		nodes[i] = &fleetNode{
			l:      share.New(share.Options{Inner: &counted{Limiter: r, calls: &redisCalls}, Membership: m, Clock: clock}),
			member: m,
			active: i < 3,
		}
	}
	hit := []bucket.Hit{{Key: key(t.Name()), Limit: boundLimit, Cost: 1, Rule: shareRule(boundShare)}}
	st := make([]bucket.State, 1)
	admitted, requests := 0, 0
	const steps, step = 120, 100 * time.Millisecond
	began := time.Now()
	for s := range steps {
		switch s {
		case 0:
		case 20: // node 3 starts, not admitted yet
			nodes[3].active = true
		case 40: // the others count it, then it is admitted
			for _, n := range nodes[:3] {
				n.member.set(4, true)
			}
			nodes[3].member.set(4, true)
		case 70: // node 2 stops
			nodes[2].active = false
			nodes[2].member.set(4, false)
		case 100: // its registration expired: the others grow
			for _, i := range []int{0, 1, 3} {
				nodes[i].member.set(3, true)
			}
		}
		if s > 0 {
			clock.Advance(step)
		}
		for range 3 {
			for _, n := range nodes {
				if !n.active {
					continue
				}
				requests++
				d, err := n.l.Hit(context.Background(), hit, st)
				if err != nil {
					t.Fatalf("step %d: %v", s, err)
				}
				if d.Allowed {
					admitted++
				}
			}
		}
	}
	real := time.Since(began)
	cells := (steps - 1) * step
	most := bound(cells, real)
	if float64(admitted) > most {
		t.Errorf("admitted %d over %v of the cells' clock and %v of Redis', more than the %.0f bound", admitted, cells, real, most)
	}
	// The cells alone admit f × rate × T less their burst at each of the
	// three changes of their share, which empty them: 0.6 × (20 × 11.9 −
	// 3 × 30) = 89; Redis' part at least its burst, 12.
	if admitted < 100 {
		t.Errorf("admitted %d, want at least 100: the cells decide their part", admitted)
	}
	if c := redisCalls.Load(); c >= int64(requests) {
		t.Errorf("%d Redis calls for %d requests: the cells decided none", c, requests)
	}
	t.Logf("admitted %d of %d requests (bound %.0f; cells' clock %v, Redis' %v), %d Redis calls", admitted, requests, most, cells, real, redisCalls.Load())
}

// counted is a layer behind that counts its calls.
type counted struct {
	bucket.Limiter
	calls *atomic.Int64
}

func (c *counted) Hit(ctx context.Context, hits []bucket.Hit, states []bucket.State) (bucket.Decision, error) {
	c.calls.Add(1)
	return c.Limiter.Hit(ctx, hits, states)
}

// Three simulated nodes, later four, each spending its cells at once
// whenever they have a token, while the shares change under them: a node
// leaves and the others grow, it is admitted again, a new node is
// admitted, and again. Over the whole window the cells alone admit at
// most the shares' part of the bound, f × (burst + rate × T): a share
// that grows gains tokens only by refill, a node not admitted refills
// nothing, and a node admitted (again) starts empty.
func TestBoundCellsOverTime(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	type node struct {
		l      *share.Limiter
		behind *recording
		member *members
	}
	nodes := make([]node, 4)
	for i := range nodes {
		behind := &recording{Limiter: memory.New(memory.Options{Clock: clock})}
		m := &members{n: 3, ok: i < 3}
		nodes[i] = node{l: share.New(share.Options{Inner: behind, Membership: m, Clock: clock}), behind: behind, member: m}
	}
	set := func(n int, ok bool, at ...int) {
		for _, i := range at {
			nodes[i].member.set(n, ok)
		}
	}
	hit := []bucket.Hit{{Key: key(t.Name()), Limit: boundLimit, Cost: 1, Rule: shareRule(boundShare)}}
	st := make([]bucket.State, 1)
	byCells := 0
	const steps, step = 100, 100 * time.Millisecond
	for s := range steps {
		switch s % 40 {
		case 10: // node 2 leaves; the others grow to n = 2
			set(3, false, 2)
			set(2, true, 0, 1)
		case 20: // node 2 is admitted again, once the others count it
			set(3, true, 0, 1, 2)
		case 30: // node 3 is admitted, once the others count it
			set(4, true, 0, 1, 2, 3)
		case 35: // node 3 leaves; the others grow to n = 3
			set(4, false, 3)
			set(3, true, 0, 1, 2)
		}
		if s > 0 {
			clock.Advance(step)
		}
		for _, n := range nodes {
			if _, ok := n.member.Share(); !ok {
				continue
			}
			// Take from the cell until a take goes behind.
			for calls := n.behind.count(); n.behind.count() == calls; byCells++ {
				if _, err := n.l.Hit(context.Background(), hit, st); err != nil {
					t.Fatal(err)
				}
			}
			byCells-- // the take that went behind
		}
	}
	T := (steps - 1) * step
	f := float64(boundShare) / 1e6
	most := f * (float64(boundLimit.Burst) + float64(boundLimit.Requests)/boundLimit.Period.Seconds()*T.Seconds())
	if float64(byCells) > most {
		t.Errorf("the cells admitted %d over %v, more than the shares' part of the bound, f × (burst + rate × T) = %.0f", byCells, T, most)
	}
	t.Logf("the cells admitted %d over %v; the shares' part of the bound is %.0f", byCells, T, most)
}
