package fallback_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/sluice-rls/sluice/backend/memory"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/fallback"
)

// TestShareConvertsWhenNodesChange: the share of a global bucket is the
// same bucket at rate/N, so when the live node count changes, what this
// node spent stays spent (converted, as any changed limit) instead of being
// read as the old "full again" instant under the new share.
func TestShareConvertsWhenNodesChange(t *testing.T) {
	clock := clockwork.NewFakeClock()
	var nodes atomic.Int64
	nodes.Store(2)
	p := &primary{mem: memory.New(memory.Options{Clock: clock})}
	p.down.Store(true)
	sw := fallback.New(fallback.Options{
		Primary: p,
		Share:   memory.New(memory.Options{Clock: clock}),
		Probe:   func(context.Context) error { return errors.New("down") },
		Nodes:   func() int { return int(nodes.Load()) },
		Mode:    fallback.Share,
		Clock:   clock,
	})
	t.Cleanup(sw.Close)
	lim := bucket.Limit{Requests: 12, Period: time.Hour, Burst: 12}
	hit := func(cost uint64) (bool, bucket.State) {
		t.Helper()
		states := make([]bucket.State, 1)
		d, err := sw.Hit(context.Background(), []bucket.Hit{{Key: bucket.Key{7}, Limit: lim, Cost: cost}}, states)
		if err != nil || d.Answer != bucket.Fallback {
			t.Fatalf("Hit: %+v, %v; want an answer of the share", d, err)
		}
		return d.Allowed, states[0]
	}
	// Two nodes: this one's share is 12 per 2 hours, burst 6.
	if ok, st := hit(6); !ok || st.Remaining != 0 {
		t.Fatalf("6 of a share of 6: %v %+v, want allowed, 0 left", ok, st)
	}
	// Alone: the whole limit, 12 per hour, burst 12; 6 spent.
	nodes.Store(1)
	if ok, st := hit(0); !ok || st.Remaining != 6 {
		t.Errorf("alone after spending 6: %v %+v, want 6 left of 12", ok, st)
	}
}

// TestShareTracksRedisUse: what a node admits through Redis is charged to
// its share too, so that once Redis fails the node admits only the part of
// its share it has not spent, not a fresh burst/N on top of Redis' count.
func TestShareTracksRedisUse(t *testing.T) {
	sw, p := twoNodeShare(t)
	// 10 an hour, burst 10: this node's share is 5 per 2 hours, burst 5.
	hits := []bucket.Hit{{Key: bucket.Key{9}, Limit: bucket.Limit{Requests: 10, Period: time.Hour, Burst: 10}, Cost: 1}}
	admitted := func(want bucket.Answer) bool {
		t.Helper()
		d, err := sw.Hit(context.Background(), hits, make([]bucket.State, 1))
		if err != nil || d.Answer != want {
			t.Fatalf("Hit: %+v, %v; want Answer %v", d, err, want)
		}
		return d.Allowed
	}
	for i := range 3 {
		if !admitted(bucket.Decided) {
			t.Fatalf("request %d through Redis refused", i+1)
		}
	}
	p.down.Store(true)
	n := 0
	for range 5 {
		if admitted(bucket.Fallback) {
			n++
		}
	}
	if n != 2 {
		t.Errorf("the fallback admitted %d after 3 through Redis, want 2 (a share of 5, 3 spent)", n)
	}
}

// TestShareTracksRefusedDemand: takes Redis refused are charged to the
// share too — the node's demand, not its admits — so a node that Redis kept
// refusing does not find a full share when it falls back.
func TestShareTracksRefusedDemand(t *testing.T) {
	sw, p := twoNodeShare(t)
	lim := bucket.Limit{Requests: 10, Period: time.Hour, Burst: 10}
	hits := []bucket.Hit{{Key: bucket.Key{9}, Limit: lim, Cost: 1}}
	// The other nodes spent the whole global bucket.
	if d, err := p.mem.Hit(context.Background(), []bucket.Hit{{Key: bucket.Key{9}, Limit: lim, Cost: 10}}, make([]bucket.State, 1)); err != nil || !d.Allowed {
		t.Fatalf("draining the global bucket: %+v, %v", d, err)
	}
	for i := range 3 {
		if d, err := sw.Hit(context.Background(), hits, make([]bucket.State, 1)); err != nil || d.Answer != bucket.Decided || d.Allowed {
			t.Fatalf("request %d through Redis: %+v, %v; want refused by Redis", i+1, d, err)
		}
	}
	p.down.Store(true)
	n := 0
	for range 5 {
		if d, _ := sw.Hit(context.Background(), hits, make([]bucket.State, 1)); d.Allowed {
			n++
		}
	}
	if n != 2 {
		t.Errorf("the fallback admitted %d after 3 refused through Redis, want 2 (a share of 5, 3 asked for)", n)
	}
}

// twoNodeShare returns a switch in Share mode over a memory primary (up
// until its down flag is set), one of 2 live nodes, on a fake clock.
func twoNodeShare(t *testing.T) (*fallback.Limiter, *primary) {
	t.Helper()
	clock := clockwork.NewFakeClock()
	p := &primary{mem: memory.New(memory.Options{Clock: clock})}
	sw := fallback.New(fallback.Options{
		Primary: p,
		Share:   memory.New(memory.Options{Clock: clock}),
		Probe:   func(context.Context) error { return errors.New("down") },
		Nodes:   func() int { return 2 },
		Mode:    fallback.Share,
		Clock:   clock,
	})
	t.Cleanup(sw.Close)
	return sw, p
}
