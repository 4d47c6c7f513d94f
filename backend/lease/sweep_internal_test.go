package lease

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/sluice-rls/sluice/backend/leaseproto"
	"github.com/sluice-rls/sluice/bucket"
)

// sweepingLeaser lets a lease period pass and Run's sweep forget idle keys
// while its first call is on its way to Redis, as a Redis call slower
// than the lease period does on a saturated node.
type sweepingLeaser struct {
	Leaser
	l     *Limiter
	clock *clockwork.FakeClock
	swept atomic.Bool
}

func (s *sweepingLeaser) Lease(ctx context.Context, ops []leaseproto.Op, out []leaseproto.Reply) error {
	if s.swept.CompareAndSwap(false, true) {
		s.clock.Advance(2 * s.l.opts.Period)
		_ = s.l.step(ctx, stepTick) // its own calls come back here
	}
	return s.Leaser.Lease(ctx, ops, out)
}

// A key forgotten by the sweep while its decision waits on Redis is
// decided from the reply all the same: the node neither crashes nor
// counts the reply on an entry it no longer has.
func TestKeySweptDuringItsCall(t *testing.T) {
	r := startRedis(t, "swept")
	clock := clockwork.NewFakeClock()
	s := &sweepingLeaser{Leaser: r, clock: clock}
	l := New(Options{Leaser: s, Exact: r, Default: Leased, Clock: clock, Period: time.Second, EagerLeases: true})
	s.l = l
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	lim := bucket.Limit{Requests: 10, Period: time.Hour, Burst: 10}
	hits := []bucket.Hit{{Key: bucket.SumKey([]byte("swept")), Limit: lim, Cost: 1}}
	states := make([]bucket.State, 1)
	d, err := l.Hit(context.Background(), hits, states)
	if err != nil {
		t.Fatal(err)
	}
	if !d.Allowed {
		t.Errorf("first take of a full bucket refused: %+v", states[0])
	}
}
