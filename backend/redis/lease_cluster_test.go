package redis_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/backend/leaseproto"
	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/internal/redistest"
)

// nodeCalls counts the EVALSHA calls that reach each cluster node, by
// address: one per script call (an EVAL follows when NOSCRIPT answers),
// counted where the call arrives, redirected calls included.
type nodeCalls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *nodeCalls) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.n)
}

// since returns the calls per node since before, nodes without calls
// left out.
func (c *nodeCalls) since(before map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range c.snapshot() {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// nodeHook adds each EVALSHA its node client sends to calls.
type nodeHook struct {
	addr  string
	calls *nodeCalls
}

func (nodeHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h nodeHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		h.count([]goredis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

func (h nodeHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		h.count(cmds)
		return next(ctx, cmds)
	}
}

func (h nodeHook) count(cmds []goredis.Cmder) {
	h.calls.mu.Lock()
	defer h.calls.mu.Unlock()
	for _, cmd := range cmds {
		if cmd.Name() == "evalsha" {
			h.calls.n[h.addr]++
		}
	}
}

// leaseFixture is a Limiter on its own cluster client, whose script calls
// are counted per node, with its own key prefix.
type leaseFixture struct {
	t      *testing.T
	l      *redisbackend.Limiter
	cc     *goredis.ClusterClient
	calls  *nodeCalls
	prefix string
}

func newLeaseFixture(t *testing.T, cl *redistest.Cluster, prefix string) *leaseFixture {
	t.Helper()
	calls := &nodeCalls{n: map[string]int{}}
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{
		Addrs: cl.Addrs(),
		NewClient: func(opt *goredis.Options) *goredis.Client {
			c := goredis.NewClient(opt)
			c.AddHook(nodeHook{addr: opt.Addr, calls: calls})
			return c
		},
	})
	t.Cleanup(func() { _ = cc.Close() })
	l := redisbackend.New(redisbackend.Options{Client: cc, Prefix: prefix, Timeout: time.Second, CacheSize: -1})
	t.Cleanup(l.Close) // before the client's Close: cleanups run last first
	return &leaseFixture{t: t, l: l, cc: cc, calls: calls, prefix: prefix}
}

// lease runs ops and fails the test on error.
func (f *leaseFixture) lease(ops ...leaseproto.Op) []leaseproto.Reply {
	f.t.Helper()
	out := make([]leaseproto.Reply, len(ops))
	if err := f.l.Lease(context.Background(), ops, out); err != nil {
		f.t.Fatalf("Lease(%+v): %v", ops, err)
	}
	return out
}

// tokens reads bucket k's whole tokens in Redis through a prefetch that
// leases nothing.
func (f *leaseFixture) tokens(k bucket.Key) uint64 {
	f.t.Helper()
	return f.lease(leaseproto.Op{Key: k, Limit: hourly, Decision: 1, Kind: leaseproto.Independent, Share: 1})[0].Remaining
}

// leaseKey returns the Redis key of leased bucket k.
func leaseKey(prefix string, k bucket.Key) string {
	return fmt.Sprintf("%s:lease:{%x}", prefix, k[:])
}

// place returns the slot of leased bucket k and its master, as f's client
// sees it.
func (f *leaseFixture) place(k bucket.Key) (slot int, master string) {
	f.t.Helper()
	ctx := context.Background()
	s, err := f.cc.ClusterKeySlot(ctx, leaseKey(f.prefix, k)).Result()
	if err != nil {
		f.t.Fatalf("CLUSTER KEYSLOT: %v", err)
	}
	m, err := f.cc.MasterForKey(ctx, leaseKey(f.prefix, k))
	if err != nil {
		f.t.Fatalf("MasterForKey: %v", err)
	}
	return int(s), m.Options().Addr
}

// take is a lease op of decision d taking one token of k, leasing one more.
func take(k bucket.Key, d uint64) leaseproto.Op {
	return leaseproto.Op{Key: k, Limit: hourly, Decision: d, Kind: leaseproto.Take, Need: 1, Take: 1, Extra: 1, Share: 2}
}

// testLeasePerMaster: a Lease batch over many slots of every master costs
// one script call per master touched; a decision spanning masters stays
// all-or-nothing (a refund call on each master that took), and a decision
// refused within one master's call takes nothing there and gets no refund.
func testLeasePerMaster(t *testing.T, cl *redistest.Cluster) {
	f := newLeaseFixture(t, cl, strings.ReplaceAll(t.Name(), "/", "-"))
	ctx := context.Background()
	// 60 buckets, each its own decision: spread over about 60 slots of the 3
	// masters.
	var ops []leaseproto.Op
	slots, byMaster := map[int]bool{}, map[string][]bucket.Key{}
	var masters []string // in order of first bucket
	for i := range 60 {
		k := f.key(i)
		s, m := f.place(k)
		slots[s] = true
		if byMaster[m] == nil {
			masters = append(masters, m)
		}
		byMaster[m] = append(byMaster[m], k)
		ops = append(ops, take(k, uint64(i+1)))
	}
	if len(masters) != 3 || len(slots) < 50 || len(byMaster[masters[1]]) < 2 {
		t.Fatalf("60 buckets in %d slots of %d masters, want 3 masters and ≥ 50 slots", len(slots), len(masters))
	}
	before := f.calls.snapshot()
	out := f.lease(ops...)
	calls := f.calls.since(before)
	t.Logf("60 buckets in %d slots of 3 masters: script calls per master %v", len(slots), calls)
	for _, m := range masters {
		if calls[m] != 1 {
			t.Errorf("master %s (%d buckets): %d script calls, want 1", m, len(byMaster[m]), calls[m])
		}
	}
	if len(calls) != len(masters) {
		t.Errorf("script calls on %v, want only the 3 masters %v", calls, masters)
	}
	for i, r := range out {
		if !r.Allowed || r.Leased != 1 || r.Remaining != 3 {
			t.Errorf("op %d: %+v, want allowed, 1 leased, 3 left", i, r)
		}
		key := leaseKey(f.prefix, ops[i].Key)
		m, err := f.cc.MasterForKey(ctx, key)
		if err != nil {
			t.Fatalf("MasterForKey: %v", err)
		}
		if n, err := m.Exists(ctx, key).Result(); err != nil || n != 1 {
			t.Errorf("bucket %d on its master: EXISTS = %d, %v; want 1", i, n, err)
		}
	}

	// A decision over three masters refused on one: the other two give
	// back, one call each. In the same batch, a decision over two buckets
	// of one master refused there: nothing taken, nothing given back.
	a, b, c := byMaster[masters[0]][0], byMaster[masters[1]][0], byMaster[masters[2]][0]
	same := byMaster[masters[1]][1]
	one := func(k bucket.Key, d, n uint64) leaseproto.Op {
		return leaseproto.Op{Key: k, Limit: hourly, Decision: d, Kind: leaseproto.Take, Need: n, Take: n, Share: 1}
	}
	f.lease(one(b, 1, 3)) // b: 3 → 0
	before = f.calls.snapshot()
	out = f.lease(
		take(a, 1), // 3 → 1, then refunded
		one(b, 1, 1),
		take(c, 1),
		one(same, 2, 1), // allowed alone, not taken: its decision is refused
		one(b, 2, 1),
	)
	calls = f.calls.since(before)
	t.Logf("decisions refused within and across masters: script calls per master %v", calls)
	if !out[0].Allowed || out[1].Allowed || !out[2].Allowed || out[0].Leased != 0 || out[2].Leased != 0 {
		t.Errorf("decision refused on b's master: %+v, want a and c allowed (refunded, nothing leased), b refused", out[:3])
	}
	if out[0].Remaining != 3 || out[2].Remaining != 3 {
		t.Errorf("refunded a and c report %d and %d tokens, want 3 and 3 (after the refund)", out[0].Remaining, out[2].Remaining)
	}
	if out[4].Allowed {
		t.Errorf("decision 2: b allowed %+v, want refused", out[4])
	}
	want := map[string]int{masters[0]: 2, masters[1]: 1, masters[2]: 2}
	if !maps.Equal(calls, want) {
		t.Errorf("script calls per master %v, want %v (one each, plus a refund where a or c took)", calls, want)
	}
	for _, kt := range []struct {
		name string
		k    bucket.Key
		want uint64
	}{{"a", a, 3}, {"b", b, 0}, {"c", c, 3}, {"b's neighbour", same, 3}} {
		if got := f.tokens(kt.k); got != kt.want {
			t.Errorf("bucket %s after the refusals: %d tokens, want %d", kt.name, got, kt.want)
		}
	}
}

// key derives bucket key n of f from the test name.
func (f *leaseFixture) key(n int) bucket.Key {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s/%d", f.t.Name(), n))
	return bucket.Key(sum[:16])
}

// testLeaseStaleSlotMap: a client whose slot map is stale sends a master a
// call with a bucket of a slot that moved away; lease.lua refuses before
// writing, and the call's ops go again one call per slot. Every answer, and
// every bucket after it, is what a client with a fresh map gets: no token
// counted twice, no error.
func testLeaseStaleSlotMap(t *testing.T, cl *redistest.Cluster) {
	ctx := context.Background()
	stale := newLeaseFixture(t, cl, "lease-stale")
	fresh := newLeaseFixture(t, cl, "lease-fresh") // same slots: the hash tag is the bucket's
	master := func(addr string) int { return slices.Index(cl.Addrs(), addr) }
	// a and moved on one master in different slots, moved's slot empty (to
	// move it); other on another master.
	var a, moved, other bucket.Key
	var aSlot, movedSlot int
	var owner string
	for i := 0; i < 1000 && (moved == bucket.Key{} || other == bucket.Key{}); i++ {
		k := stale.key(i)
		s, m := stale.place(k)
		switch {
		case owner == "":
			a, aSlot, owner = k, s, m
		case m == owner && s != aSlot && moved == bucket.Key{}:
			n, err := cl.Master(master(m)).Client().ClusterCountKeysInSlot(ctx, s).Result()
			if err == nil && n == 0 {
				moved, movedSlot = k, s
			}
		case m != owner && other == bucket.Key{}:
			other = k
		}
	}
	if moved == (bucket.Key{}) || other == (bucket.Key{}) {
		t.Fatal("no keys for the test")
	}
	// The stale client learns the slot map, then moved's slot moves; the
	// fresh client's first call (its twin of the stale one's) comes after.
	stale.lease(take(a, 1))
	to := (master(owner) + 1) % 3
	cl.MoveSlot(movedSlot, to)
	fresh.lease(take(a, 1))
	ops := []leaseproto.Op{
		take(a, 1), // first: the master call routes to the old master
		take(moved, 1),
		take(other, 1),
		take(moved, 2),
		// Decision 3 spans slots (and, freshly, masters): refused by moved,
		// so a gives back what it took.
		{Key: moved, Limit: hourly, Decision: 3, Kind: leaseproto.Take, Need: 5, Take: 5, Share: 1},
		take(a, 3),
	}
	before := stale.calls.snapshot()
	got := stale.lease(ops...)
	calls := stale.calls.since(before)
	want := fresh.lease(ops...)
	t.Logf("stale slot map: script calls per master %v", calls)
	for i := range ops {
		g, w := got[i], want[i]
		if g.Allowed != w.Allowed || g.Leased != w.Leased || g.Remaining != w.Remaining {
			t.Errorf("op %d: stale client %+v, fresh client %+v", i, g, w)
		}
	}
	if !want[0].Allowed || !want[1].Allowed || !want[3].Allowed || want[4].Allowed || want[1].Remaining != 3 || want[3].Remaining != 1 || want[5].Remaining != 1 {
		t.Errorf("fresh client: %+v, want takes allowed, leasing, the take of 5 refused and a's refunded", want)
	}
	for _, k := range []bucket.Key{a, moved, other} {
		if g, w := stale.tokens(k), fresh.tokens(k); g != w {
			t.Errorf("bucket %x after the stale calls: %d tokens, fresh client's twin %d", k[:4], g, w)
		}
	}
	if n, err := cl.Master(to).Client().Exists(ctx, leaseKey(stale.prefix, moved)).Result(); err != nil || n != 1 {
		t.Errorf("moved bucket on its new master: EXISTS = %d, %v; want 1", n, err)
	}
	if calls[cl.Addrs()[to]] == 0 {
		t.Errorf("no script call reached the slot's new master %s: %v", cl.Addrs()[to], calls)
	}
}
