package redis_test

import (
	"context"
	"slices"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/internal/redistest"
)

// TestCluster runs the behaviour suite, then cluster-only tests, on a real
// 3-master Redis Cluster.
func TestCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	e := clusterEnv(cl)
	t.Run("group", func(t *testing.T) {
		runBehaviours(t, e)
		t.Run("Slots", func(t *testing.T) { t.Parallel(); testSlots(t, e) })
		t.Run("CrossSlotRefund", func(t *testing.T) { t.Parallel(); testCrossSlotRefund(t, e) })
		t.Run("LeasePerMaster", func(t *testing.T) { t.Parallel(); testLeasePerMaster(t, cl) })
	})
	// Alone, as it flushes the scripts.
	t.Run("OneMasterOneCall", func(t *testing.T) { testOneMasterOneCall(t, e) })
	// Alone, as it moves a slot.
	t.Run("StaleSlotMap", func(t *testing.T) { testStaleSlotMap(t, e, cl) })
	t.Run("LeaseStaleSlotMap", func(t *testing.T) { testLeaseStaleSlotMap(t, cl) })
	// Last, as it takes a master down.
	t.Run("MasterDown", func(t *testing.T) { testMasterDown(t, e, cl) })
}

// place is where bucket key i of a fixture lives, as its client sees it.
type place struct {
	key    bucket.Key
	slot   int
	master string // address
}

func placeOf(t *testing.T, f *fixture, i int) place {
	t.Helper()
	ctx := context.Background()
	cc := f.client.(*goredis.ClusterClient)
	k := f.key(i)
	slot, err := cc.ClusterKeySlot(ctx, redisKey(f.prefix, k)).Result()
	if err != nil {
		t.Fatalf("CLUSTER KEYSLOT: %v", err)
	}
	m, err := cc.MasterForKey(ctx, redisKey(f.prefix, k))
	if err != nil {
		t.Fatalf("MasterForKey: %v", err)
	}
	return place{key: k, slot: int(slot), master: m.Options().Addr}
}

// keysOnMasters returns bucket keys of f on n different masters, with their
// slots.
func keysOnMasters(t *testing.T, f *fixture, n int) ([]bucket.Key, []int64) {
	t.Helper()
	var keys []bucket.Key
	var slots []int64
	seen := map[string]bool{}
	for i := 0; len(keys) < n && i < 1000; i++ {
		if p := placeOf(t, f, i); !seen[p.master] {
			seen[p.master] = true
			keys = append(keys, p.key)
			slots = append(slots, int64(p.slot))
		}
	}
	if len(keys) < n {
		t.Fatalf("found keys on %d masters, want %d", len(keys), n)
	}
	return keys, slots
}

// oneMaster returns n buckets of f in different slots of one master, each
// one that ok accepts (nil: any).
func oneMaster(t *testing.T, f *fixture, n int, ok func(place) bool) []place {
	t.Helper()
	var ps []place
	slots := map[int]bool{}
	for i := 0; len(ps) < n && i < 1000; i++ {
		p := placeOf(t, f, i)
		if (len(ps) > 0 && p.master != ps[0].master) || slots[p.slot] || (ok != nil && !ok(p)) {
			continue
		}
		slots[p.slot] = true
		ps = append(ps, p)
	}
	if len(ps) < n {
		t.Fatalf("found %d keys in different slots of one master, want %d", len(ps), n)
	}
	return ps
}

func testSlots(t *testing.T, e env) {
	f := e.fixture(t, redisbackend.Options{})
	ctx := context.Background()
	cc := f.client.(*goredis.ClusterClient)
	// 30 buckets in one decision: spread over masters, all decided.
	var hits []bucket.Hit
	for i := range 30 {
		hits = append(hits, bucket.Hit{Key: f.key(i), Limit: slow, Cost: 1})
	}
	ok, st := f.hit(hits...)
	if !ok {
		t.Fatalf("30 fresh buckets: refused %+v", st)
	}
	masters := map[string]bool{}
	for _, h := range hits {
		key := redisKey(f.prefix, h.Key)
		m, err := cc.MasterForKey(ctx, key)
		if err != nil {
			t.Fatalf("MasterForKey: %v", err)
		}
		masters[m.Options().Addr] = true
		if n, err := m.Exists(ctx, key).Result(); err != nil || n != 1 {
			t.Errorf("%s on its master: EXISTS = %d, %v; want 1", key, n, err)
		}
	}
	if len(masters) != 3 {
		t.Errorf("30 buckets on %d masters, want 3", len(masters))
	}
	if n := f.calls.Load(); n != 30 {
		t.Logf("30 buckets in 30 slots: %d script calls", n)
	}
}

func testCrossSlotRefund(t *testing.T, e env) {
	f := e.fixture(t, redisbackend.Options{})
	keys, slots := keysOnMasters(t, f, 3)
	a, b, c := keys[0], keys[1], keys[2]
	t.Logf("slots %v", slots)
	f.hit(bucket.Hit{Key: b, Limit: hourly, Cost: 5})
	before := f.calls.Load()
	ok, st := f.hit(
		bucket.Hit{Key: a, Limit: hourly, Cost: 2},
		bucket.Hit{Key: b, Limit: hourly, Cost: 1},
		bucket.Hit{Key: c, Limit: hourly, Cost: 1, Independent: true},
		bucket.Hit{Key: c, Limit: hourly, Cost: 1},
	)
	if ok || !st[0].Allowed || st[1].Allowed || !st[2].Allowed || !st[3].Allowed {
		t.Fatalf("decision refused in one slot: %v %+v, want refused by b only", ok, st)
	}
	if st[0].Remaining != 5 {
		t.Errorf("refunded hit on a: Remaining %d, want 5 (after the refund)", st[0].Remaining)
	}
	if n := f.calls.Load() - before; n != 5 {
		t.Errorf("3 slots, 2 refunded: %d script calls, want 5", n)
	}
	if got := f.remaining(a, hourly); got != 5 {
		t.Errorf("bucket a after the refund: %d tokens, want 5", got)
	}
	if got := f.remaining(c, hourly); got != 4 {
		t.Errorf("bucket c after the refund: %d tokens, want 4 (the independent hit stays)", got)
	}
	if got := f.remaining(b, hourly); got != 0 {
		t.Errorf("bucket b: %d tokens, want 0", got)
	}
}

func testMasterDown(t *testing.T, e env, cl *redistest.Cluster) {
	// The fixture's generous Timeout: the set-up, the live master's hit and
	// the polls after the restart ran under 200ms, which a loaded machine
	// misses; a killed master refuses connections at once.
	f := e.fixture(t, redisbackend.Options{})
	keys, slots := keysOnMasters(t, f, 3)
	down := cl.MasterOfSlot(int(slots[0]))
	f.hit(bucket.Hit{Key: keys[0], Limit: slow, Cost: 1})
	cl.Master(down).Kill()
	states := make([]bucket.State, 1)
	_, err := f.l.Hit(context.Background(), []bucket.Hit{{Key: keys[0], Limit: slow, Cost: 1}}, states)
	if kind := redisbackend.ErrorKind(err); kind != redisbackend.KindConnection && kind != redisbackend.KindTimeout {
		t.Errorf("Hit on a dead master: %v (kind %q), want kind connection or timeout", err, kind)
	}
	if ok, st := f.hit(bucket.Hit{Key: keys[1], Limit: slow, Cost: 1}); !ok {
		t.Errorf("Hit on a live master: %v %+v, want allowed", ok, st)
	}
	cl.Master(down).Restart()
	cl.WaitOK()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := f.l.Hit(context.Background(), []bucket.Hit{{Key: keys[0], Limit: slow, Cost: 1}}, states)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Hit after the master restarted still fails after 10s: %v", err)
		}
		time.Sleep(5 * time.Millisecond) // poll interval, bounded by the deadline
	}
}

// testOneMasterOneCall: a decision over two slots of one master is one
// script call, all-or-nothing across the slots, and recovers from NOSCRIPT.
func testOneMasterOneCall(t *testing.T, e env) {
	f := e.fixture(t, redisbackend.Options{})
	ps := oneMaster(t, f, 2, nil)
	keys := []bucket.Key{ps[0].key, ps[1].key}
	// Round 1 after SCRIPT FLUSH: EVALSHA (NOSCRIPT), then EVAL, uncounted.
	for round, want := range []uint64{4, 3} {
		if round == 1 {
			flushScripts(t, f.client)
		}
		before := f.calls.Load()
		ok, st := f.hit(
			bucket.Hit{Key: keys[0], Limit: hourly, Cost: 1},
			bucket.Hit{Key: keys[1], Limit: hourly, Cost: 1},
		)
		if !ok || st[0].Remaining != want || st[1].Remaining != want {
			t.Errorf("round %d: %v %+v, want allowed with %d left in each", round, ok, st, want)
		}
		if n := f.calls.Load() - before; n != 1 {
			t.Errorf("round %d: two slots of one master: %d EVALSHA calls, want 1", round, n)
		}
	}
	// Refused in one slot: nothing taken in the other, and no refund call.
	before := f.calls.Load()
	ok, st := f.hit(
		bucket.Hit{Key: keys[0], Limit: hourly, Cost: 1},
		bucket.Hit{Key: keys[1], Limit: hourly, Cost: 5},
	)
	if ok || !st[0].Allowed || st[1].Allowed {
		t.Errorf("cost 5 on a bucket of 3: %v %+v, want refused by the second hit", ok, st)
	}
	if n := f.calls.Load() - before; n != 1 {
		t.Errorf("refused decision on one master: %d script calls, want 1 (no refund)", n)
	}
	if got := f.remaining(keys[0], hourly); got != 3 {
		t.Errorf("first bucket after the refusal: %d tokens, want 3 (nothing taken)", got)
	}
}

// testStaleSlotMap: a call built on a stale slot map reaches a master that
// no longer serves one of its buckets; the decision is then made slot by
// slot, and no token is taken twice, on that master or on another one whose
// call had succeeded.
func testStaleSlotMap(t *testing.T, e env, cl *redistest.Cluster) {
	f := e.fixture(t, redisbackend.Options{}) // the fixture's generous Timeout
	ctx := context.Background()
	master := func(addr string) int { return slices.Index(cl.Addrs(), addr) }
	// Two buckets of one master in different slots, both empty so that the
	// second can move; and one bucket on another master.
	ps := oneMaster(t, f, 2, func(p place) bool {
		n, err := cl.Master(master(p.master)).Client().ClusterCountKeysInSlot(ctx, p.slot).Result()
		return err == nil && n == 0
	})
	keys, slots, owner := []bucket.Key{ps[0].key, ps[1].key}, []int{ps[0].slot, ps[1].slot}, master(ps[0].master)
	var other bucket.Key
	for i := 1000; i < 2000; i++ {
		if p := placeOf(t, f, i); p.master != ps[0].master {
			other = p.key
			break
		}
	}
	// The client learns the slot map, then the second slot moves.
	if ok, st := f.hit(bucket.Hit{Key: keys[0], Limit: hourly, Cost: 1}); !ok {
		t.Fatalf("first hit: refused %+v", st)
	}
	to := (owner + 1) % 3
	cl.MoveSlot(slots[1], to)
	before := f.calls.Load()
	ok, st := f.hit(
		bucket.Hit{Key: keys[0], Limit: hourly, Cost: 1},
		bucket.Hit{Key: keys[1], Limit: hourly, Cost: 2},
		bucket.Hit{Key: other, Limit: hourly, Cost: 1},
	)
	if !ok || st[0].Remaining != 3 || st[1].Remaining != 3 || st[2].Remaining != 4 {
		t.Errorf("hit across a moved slot: %v %+v, want allowed with 3, 3 and 4 left", ok, st)
	}
	t.Logf("%d script calls (merged: one refused, one taken then refunded; then one per slot)", f.calls.Load()-before)
	if got := f.remaining(keys[0], hourly); got != 3 {
		t.Errorf("bucket on the old master: %d tokens, want 3 (taken once)", got)
	}
	if got := f.remaining(other, hourly); got != 4 {
		t.Errorf("bucket on another master: %d tokens, want 4 (taken, given back, taken again)", got)
	}
	if n, err := cl.Master(to).Client().Exists(ctx, redisKey(f.prefix, keys[1])).Result(); err != nil || n != 1 {
		t.Errorf("moved bucket on its new master: EXISTS = %d, %v; want 1", n, err)
	}
}
