package redis_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/sluice-rls/sluice/backend/leaseproto"
	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/bucket"
)

// testEmptyCacheLimitChange checks that the empty-bucket cache answers only
// under the Limit Redis reported the bucket empty under: a bucket key is its
// rule and values, not its numbers, so after a raise (3/day to 4/day) the
// key's next hit goes to Redis, which converts the bucket and allows
// exactly one more.
func testEmptyCacheLimitChange(t *testing.T, e env) {
	clk := clockwork.NewFakeClockAt(time.Unix(1_000_000, 0))
	f := e.fixture(t, redisbackend.Options{Clock: clk, CacheSize: 1000})
	k := f.key(0)
	three := bucket.Limit{Requests: 3, Period: 24 * time.Hour, Burst: 3}
	four := bucket.Limit{Requests: 4, Period: 24 * time.Hour, Burst: 4}
	if ok, st := f.hit(bucket.Hit{Key: k, Limit: three, Cost: 3}); !ok || st[0].Remaining != 0 {
		t.Fatalf("3 of 3/day: %v %+v, want allowed, 0 left", ok, st[0])
	}
	calls := func(what string, want int64, hit bucket.Hit, wantOK bool) {
		t.Helper()
		before := f.calls.Load()
		if ok, st := f.hit(hit); ok != wantOK {
			t.Errorf("%s: allowed %v %+v, want %v", what, ok, st[0], wantOK)
		}
		if n := f.calls.Load() - before; n != want {
			t.Errorf("%s: %d script calls, want %d", what, n, want)
		}
	}
	calls("4th of 3/day, the bucket known empty", 0, bucket.Hit{Key: k, Limit: three, Cost: 1}, false)
	calls("1 under 4/day after 3 spent", 1, bucket.Hit{Key: k, Limit: four, Cost: 1}, true)
	calls("2nd under 4/day, the bucket known empty", 0, bucket.Hit{Key: k, Limit: four, Cost: 1}, false)
	calls("back under 3/day: Redis decides", 1, bucket.Hit{Key: k, Limit: three, Cost: 1}, false)
}

// testValueFormat checks the bucket value: four little-endian doubles (the
// TAT in µs, the expiry in ms, the interval in µs and the burst of the
// limit it was written under), and that a value in the earlier 16-byte
// form reads as a full bucket.
func testValueFormat(t *testing.T, e env) {
	f := e.fixture(t, redisbackend.Options{})
	ctx := context.Background()
	k := f.key(0)
	key := redisKey(f.prefix, k)
	old := make([]byte, 16)
	binary.LittleEndian.PutUint64(old, math.Float64bits(1e18)) // a TAT far ahead
	binary.LittleEndian.PutUint64(old[8:], math.Float64bits(1e15))
	if err := f.client.Set(ctx, key, old, time.Minute).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if got := f.remaining(k, slow); got != slow.Burst {
		t.Errorf("bucket with a 16-byte value: %d tokens, want full (%d)", got, slow.Burst)
	}
	f.hit(bucket.Hit{Key: k, Limit: slow, Cost: 2})
	v, err := f.client.Get(ctx, key).Bytes()
	if err != nil || len(v) != 32 {
		t.Fatalf("GET after a take: %d bytes (%v), want 32", len(v), err)
	}
	d := func(i int) float64 { return math.Float64frombits(binary.LittleEndian.Uint64(v[8*i:])) }
	if iv, burst := d(2), d(3); iv != 1e6 || burst != float64(slow.Burst) {
		t.Errorf("value records interval %vµs, burst %v; want 1e6µs (1/s), %d", iv, burst, slow.Burst)
	}
}

// testBeyondLoweredBurst checks a bucket that took more than a lowered
// burst, in token_bucket.lua (Hit, with the empty-bucket cache on) and in
// lease.lua (Lease): the tokens it lacks stay lacking (never clamped to
// the smaller burst), it reports 0 remaining, a RetryAfter until the take
// fits and a ResetAfter until it is full, and the bucket converted back to
// the larger limit still lacks them all. Limits of 1 token a second and a
// token every 2 s, so that the test's own time moves nothing by a token.
func testBeyondLoweredBurst(t *testing.T, e env) {
	big := bucket.Limit{Requests: 100, Period: 100 * time.Second, Burst: 100}
	small := bucket.Limit{Requests: 50, Period: 100 * time.Second, Burst: 50}
	f := e.fixture(t, redisbackend.Options{CacheSize: 1000})
	near := func(what string, got, want time.Duration) {
		t.Helper()
		if got > want+time.Millisecond || got < want-time.Second {
			t.Errorf("%s: %v, want %v (less by the test's time at most)", what, got, want)
		}
	}
	// Exact: 100 of 100 spent, then under 50/100 s burst 50: 100 lacking
	// at 2 s a token.
	k := f.key(0)
	if ok, st := f.hit(bucket.Hit{Key: k, Limit: big, Cost: 100}); !ok || st[0].Remaining != 0 {
		t.Fatalf("100 of burst 100: %v %+v, want allowed, 0 left", ok, st[0])
	}
	for _, cost := range []uint64{1, 0} {
		ok, st := f.hit(bucket.Hit{Key: k, Limit: small, Cost: cost})
		if ok || st[0].Allowed || st[0].Remaining != 0 {
			t.Errorf("cost %d under the lowered burst: %v %+v, want refused, 0 left", cost, ok, st[0])
		}
		// Cost 1 fits once 51 refilled; cost 0 is refused in debt, until 50 did.
		near(fmt.Sprintf("cost %d under the lowered burst: RetryAfter (%d tokens to refill)", cost, 50+cost), st[0].RetryAfter, time.Duration(50+cost)*2*time.Second)
		near(fmt.Sprintf("cost %d under the lowered burst: ResetAfter (100 tokens)", cost), st[0].ResetAfter, 200*time.Second)
	}
	// Back under the larger limit, converted again: still 100 lacking.
	ok, st := f.hit(bucket.Hit{Key: k, Limit: big, Cost: 1})
	if ok || st[0].Remaining != 0 {
		t.Errorf("back under burst 100: %v %+v, want refused, 0 left (nothing forgiven)", ok, st[0])
	}
	near("back under burst 100: RetryAfter", st[0].RetryAfter, time.Second)
	near("back under burst 100: ResetAfter", st[0].ResetAfter, 100*time.Second)

	// Leased: the same through lease.lua, a lease of all that is left
	// taken under the larger limit first.
	ctx := context.Background()
	k = f.key(1)
	lease := func(lim bucket.Limit, need, take, extra uint64) leaseproto.Reply {
		t.Helper()
		out := make([]leaseproto.Reply, 1)
		ops := []leaseproto.Op{{Key: k, Limit: lim, Decision: 1, Kind: leaseproto.Take, Need: need, Take: take, Extra: extra, Share: 1}}
		if err := f.l.Lease(ctx, ops, out); err != nil {
			t.Fatalf("Lease: %v", err)
		}
		return out[0]
	}
	if r := lease(big, 1, 1, 1000); !r.Allowed || r.Leased != 99 || r.Remaining != 0 {
		t.Fatalf("take 1 and lease the rest of burst 100: %+v, want allowed, 99 leased, 0 left", r)
	}
	r := lease(small, 1, 1, 1000)
	if r.Allowed || r.Leased != 0 || r.Remaining != 0 {
		t.Errorf("take under the lowered burst: %+v, want refused, nothing leased, 0 left", r)
	}
	near("leased take under the lowered burst: Retry", r.Retry, 102*time.Second)
	near("leased take under the lowered burst: Reset", r.Reset, 200*time.Second)
	if r := lease(small, 0, 0, 1000); r.Allowed || r.Leased != 0 || r.Remaining != 0 {
		t.Errorf("check or prefetch under the lowered burst: %+v, want refused (in debt), nothing leased, 0 left", r)
	}
	if r := lease(big, 1, 1, 1000); r.Allowed || r.Leased != 0 || r.Remaining != 0 {
		t.Errorf("back under burst 100: %+v, want refused, nothing leased, 0 left (nothing forgiven)", r)
	}
}
