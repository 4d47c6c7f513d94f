package redis_test

import (
	"context"
	"encoding/binary"
	"math"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

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
