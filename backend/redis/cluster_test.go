package redis_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/descriptors"
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
	})
	// Alone, as it flushes the scripts.
	t.Run("OneMasterPipeline", func(t *testing.T) { testOneMasterPipeline(t, e) })
	// Last, as it takes a master down.
	t.Run("MasterDown", func(t *testing.T) { testMasterDown(t, e, cl) })
}

// keysOnMasters returns bucket keys of f on n different masters, with their
// slots.
func keysOnMasters(t *testing.T, f *fixture, n int) ([]descriptors.Key, []int64) {
	t.Helper()
	ctx := context.Background()
	cc := f.client.(*goredis.ClusterClient)
	var keys []descriptors.Key
	var slots []int64
	seen := map[string]bool{}
	for i := 0; len(keys) < n && i < 1000; i++ {
		k := f.key(i)
		slot, err := cc.ClusterKeySlot(ctx, redisKey(f.prefix, k)).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT: %v", err)
		}
		m, err := cc.MasterForKey(ctx, redisKey(f.prefix, k))
		if err != nil {
			t.Fatalf("MasterForKey: %v", err)
		}
		if !seen[m.Options().Addr] {
			seen[m.Options().Addr] = true
			keys = append(keys, k)
			slots = append(slots, slot)
		}
	}
	if len(keys) < n {
		t.Fatalf("found keys on %d masters, want %d", len(keys), n)
	}
	return keys, slots
}

func testSlots(t *testing.T, e env) {
	f := e.fixture(t, redisbackend.Options{})
	ctx := context.Background()
	cc := f.client.(*goredis.ClusterClient)
	// 30 buckets in one decision: spread over masters, all decided.
	var hits []descriptors.Hit
	for i := range 30 {
		hits = append(hits, descriptors.Hit{Key: f.key(i), Limit: slow, Cost: 1})
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
	f.hit(descriptors.Hit{Key: b, Limit: slow, Cost: 5})
	before := f.calls.Load()
	ok, st := f.hit(
		descriptors.Hit{Key: a, Limit: slow, Cost: 2},
		descriptors.Hit{Key: b, Limit: slow, Cost: 1},
		descriptors.Hit{Key: c, Limit: slow, Cost: 1, Independent: true},
		descriptors.Hit{Key: c, Limit: slow, Cost: 1},
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
	if got := f.remaining(a, slow); got != 5 {
		t.Errorf("bucket a after the refund: %d tokens, want 5", got)
	}
	if got := f.remaining(c, slow); got != 4 {
		t.Errorf("bucket c after the refund: %d tokens, want 4 (the independent hit stays)", got)
	}
	if got := f.remaining(b, slow); got != 0 {
		t.Errorf("bucket b: %d tokens, want 0", got)
	}
}

func testMasterDown(t *testing.T, e env, cl *redistest.Cluster) {
	f := e.fixture(t, redisbackend.Options{Timeout: 200 * time.Millisecond})
	keys, slots := keysOnMasters(t, f, 3)
	down := cl.MasterOfSlot(int(slots[0]))
	f.hit(descriptors.Hit{Key: keys[0], Limit: slow, Cost: 1})
	cl.Master(down).Kill()
	states := make([]descriptors.BucketState, 1)
	_, err := f.l.Hit(context.Background(), []descriptors.Hit{{Key: keys[0], Limit: slow, Cost: 1}}, states)
	if kind := redisbackend.ErrorKind(err); kind != redisbackend.KindConnection && kind != redisbackend.KindTimeout {
		t.Errorf("Hit on a dead master: %v (kind %q), want kind connection or timeout", err, kind)
	}
	if ok, st := f.hit(descriptors.Hit{Key: keys[1], Limit: slow, Cost: 1}); !ok {
		t.Errorf("Hit on a live master: %v %+v, want allowed", ok, st)
	}
	cl.Master(down).Restart()
	cl.WaitOK()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := f.l.Hit(context.Background(), []descriptors.Hit{{Key: keys[0], Limit: slow, Cost: 1}}, states)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Hit after the master restarted still fails after 10s: %v", err)
		}
		time.Sleep(5 * time.Millisecond) // poll interval, bounded by the deadline
	}
}

// testOneMasterPipeline: a decision over two slots of one master sends its
// two script calls in one pipeline, which recovers from NOSCRIPT too.
func testOneMasterPipeline(t *testing.T, e env) {
	f := e.fixture(t, redisbackend.Options{})
	ctx := context.Background()
	cc := f.client.(*goredis.ClusterClient)
	var keys []descriptors.Key
	var master string
	slots := map[int64]bool{}
	for i := 0; len(keys) < 2 && i < 1000; i++ {
		k := f.key(i)
		slot, err := cc.ClusterKeySlot(ctx, redisKey(f.prefix, k)).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT: %v", err)
		}
		m, err := cc.MasterForKey(ctx, redisKey(f.prefix, k))
		if err != nil {
			t.Fatalf("MasterForKey: %v", err)
		}
		if master == "" {
			master = m.Options().Addr
		}
		if m.Options().Addr == master && !slots[slot] {
			slots[slot] = true
			keys = append(keys, k)
		}
	}
	if len(keys) < 2 {
		t.Fatalf("found %d keys in different slots of one master, want 2", len(keys))
	}
	pipelines := &pipelineCounter{}
	f.client.AddHook(pipelines)
	for round, want := range []uint64{4, 3} {
		if round == 1 {
			flushScripts(t, f.client)
		}
		ok, st := f.hit(
			descriptors.Hit{Key: keys[0], Limit: slow, Cost: 1},
			descriptors.Hit{Key: keys[1], Limit: slow, Cost: 1},
		)
		if !ok || st[0].Remaining != want || st[1].Remaining != want {
			t.Errorf("round %d: %v %+v, want allowed with %d left in each", round, ok, st, want)
		}
	}
	// Round 0: one pipeline; round 1: the EVALSHA pipeline, then the EVAL one.
	if n := pipelines.n.Load(); n != 3 {
		t.Errorf("two decisions over two slots of one master: %d pipelines, want 3", n)
	}
}

// pipelineCounter counts pipelines of script calls.
type pipelineCounter struct{ n atomic.Int64 }

func (*pipelineCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (*pipelineCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }

func (h *pipelineCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if len(cmds) > 0 && (cmds[0].Name() == "evalsha" || cmds[0].Name() == "eval") {
			h.n.Add(1)
		}
		return next(ctx, cmds)
	}
}
