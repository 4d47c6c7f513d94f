package memory

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jonboulle/clockwork"
	"go.uber.org/goleak"

	"github.com/sluice-rls/sluice/bucket"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// t0 is the fake clocks' start: any instant works.
var t0 = time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)

// key returns a distinct test key for n.
func key(n uint64) bucket.Key {
	var k bucket.Key
	binary.LittleEndian.PutUint64(k[:], n)
	return k
}

// keysInDistinctShards returns n keys of l that all lie in different shards.
func keysInDistinctShards(t *testing.T, l *Limiter, n int) []bucket.Key {
	t.Helper()
	var keys []bucket.Key
	var used uint64
	for i := uint64(0); len(keys) < n; i++ {
		k := key(i)
		bit := uint64(1) << shardIndex(&k, l.shift)
		if used&bit == 0 {
			used |= bit
			keys = append(keys, k)
		}
		if i > 1e6 {
			t.Fatalf("could not find %d keys in distinct shards of %d", n, len(l.shards))
		}
	}
	return keys
}

var (
	tenPerSecond = bucket.Limit{Requests: 10, Period: time.Second, Burst: 10}
	onePerHour   = bucket.Limit{Requests: 1, Period: time.Hour, Burst: 1}
)

func TestLimiterScenarios(t *testing.T) {
	t.Parallel()
	for _, sc := range bucketScenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			l := New(Options{Clock: clockwork.NewFakeClockAt(t0)})
			k := key(42)
			runScenario(t, sc, func(at time.Duration, h bucket.Hit) bucket.State {
				h.Key = k
				var st [1]bucket.State
				allowed := l.HitAt(t0.Add(at), []bucket.Hit{h}, st[:])
				if allowed != st[0].Allowed {
					t.Fatalf("HitAt = %t, but its state says Allowed = %t", allowed, st[0].Allowed)
				}
				return st[0]
			})
		})
	}
}

// call is one HitAt call of a multi-hit test and what it must return.
type call struct {
	at   time.Duration
	hits []bucket.Hit
	want bool
	// wantStates, when set, must equal the states written.
	wantStates []bucket.State
}

// runCalls makes the calls in order on a fresh limiter, then checks the
// buckets with a cost-0 check of each key in remaining (key → whole tokens).
func runCalls(t *testing.T, l *Limiter, calls []call, remaining map[bucket.Key]uint64, lim bucket.Limit) {
	t.Helper()
	var last time.Duration
	for i, c := range calls {
		states := make([]bucket.State, len(c.hits))
		if got := l.HitAt(t0.Add(c.at), c.hits, states); got != c.want {
			t.Fatalf("call %d: HitAt = %t, want %t (states %+v)", i, got, c.want, states)
		}
		if c.wantStates != nil {
			if diff := cmp.Diff(c.wantStates, states); diff != "" {
				t.Fatalf("call %d: states mismatch (-want +got):\n%s", i, diff)
			}
		}
		last = c.at
	}
	for k, want := range remaining {
		var st [1]bucket.State
		l.HitAt(t0.Add(last), []bucket.Hit{{Key: k, Limit: lim}}, st[:])
		if st[0].Remaining != want {
			t.Errorf("after the calls, key %x has %d tokens, want %d", k[:2], st[0].Remaining, want)
		}
	}
}

func TestHitAtAllOrNothing(t *testing.T) {
	t.Parallel()
	l := New(Options{})
	keys := keysInDistinctShards(t, l, 4)
	a, b, c, d := keys[0], keys[1], keys[2], keys[3]
	take := func(k bucket.Key, cost uint64) bucket.Hit {
		return bucket.Hit{Key: k, Limit: tenPerSecond, Cost: cost}
	}
	give := func(k bucket.Key, cost uint64) bucket.Hit {
		return bucket.Hit{Key: k, Limit: tenPerSecond, Cost: cost, Give: true}
	}
	shadow := func(h bucket.Hit) bucket.Hit { h.Independent = true; return h }
	overdraw := func(h bucket.Hit) bucket.Hit { h.Independent, h.Overdraw = true, true; return h }

	tests := []struct {
		name      string
		calls     []call
		remaining map[bucket.Key]uint64
	}{
		{
			name: "all allowed: every bucket pays",
			calls: []call{{hits: []bucket.Hit{take(a, 1), take(b, 2), take(c, 3)}, want: true,
				wantStates: []bucket.State{ok(9, 100*time.Millisecond), ok(8, 200*time.Millisecond), ok(7, 300*time.Millisecond)}}},
			remaining: map[bucket.Key]uint64{a: 9, b: 8, c: 7},
		},
		{
			name: "one refusal takes nothing in any shard",
			calls: []call{
				{hits: []bucket.Hit{take(c, 9)}, want: true},
				{hits: []bucket.Hit{take(a, 1), take(b, 2), take(c, 2), take(d, 1)}, want: false,
					// Allowed hits report their buckets as left: untouched.
					wantStates: []bucket.State{ok(10, 0), ok(10, 0), refused(1, 100*time.Millisecond, 900*time.Millisecond), ok(10, 0)}},
			},
			remaining: map[bucket.Key]uint64{a: 10, b: 10, c: 1, d: 10},
		},
		{
			name: "refusal first still takes nothing after it",
			calls: []call{
				{hits: []bucket.Hit{take(a, 11), take(b, 5)}, want: false},
			},
			remaining: map[bucket.Key]uint64{a: 10, b: 10},
		},
		{
			// A give is applied whatever the decision (bucket.Hit), as in
			// backend/redis: returning tokens is never refused. (It was
			// rolled back with the takes until the conformance suite,
			// bucket/buckettest, pinned the rule for both backends.)
			name: "a refused call still returns its gives' tokens",
			calls: []call{
				{hits: []bucket.Hit{take(a, 5)}, want: true},
				{hits: []bucket.Hit{give(a, 3), take(b, 11)}, want: false,
					wantStates: []bucket.State{ok(8, 200*time.Millisecond), refused(10, 0, 0)}},
			},
			remaining: map[bucket.Key]uint64{a: 8, b: 10},
		},
		{
			name: "a give on a key the refused call also took applies after the undo",
			calls: []call{
				{hits: []bucket.Hit{take(a, 5)}, want: true},
				// The take of 4 (5 → 1) is undone, then the give applies: 5 → 8.
				{hits: []bucket.Hit{take(a, 4), give(a, 3), take(b, 11)}, want: false,
					wantStates: []bucket.State{ok(8, 200*time.Millisecond), ok(8, 200*time.Millisecond), refused(10, 0, 0)}},
			},
			remaining: map[bucket.Key]uint64{a: 8, b: 10},
		},
		{
			name: "gives and takes in one allowed call",
			calls: []call{
				{hits: []bucket.Hit{take(a, 5)}, want: true},
				{hits: []bucket.Hit{give(a, 3), take(b, 1)}, want: true},
			},
			remaining: map[bucket.Key]uint64{a: 8, b: 9},
		},
		{
			name: "same key twice sees its first hit",
			calls: []call{
				{hits: []bucket.Hit{take(a, 6), take(a, 4)}, want: true,
					wantStates: []bucket.State{ok(4, 600*time.Millisecond), ok(0, time.Second)}},
			},
			remaining: map[bucket.Key]uint64{a: 0},
		},
		{
			name: "same key twice: the second hit is refused, the first is undone",
			calls: []call{
				{hits: []bucket.Hit{take(a, 6), take(b, 1), take(a, 5)}, want: false,
					wantStates: []bucket.State{ok(10, 0), ok(10, 0), refused(10, 100*time.Millisecond, 0)}},
			},
			remaining: map[bucket.Key]uint64{a: 10, b: 10},
		},
		{
			// The takes are decided before the gives, whatever the order
			// in the call (bucket.Hit), so a give cannot make room for a
			// take of the same call; it is applied anyway.
			name: "same key: a give back does not help a take",
			calls: []call{
				{hits: []bucket.Hit{take(a, 10)}, want: true},
				{hits: []bucket.Hit{give(a, 4), take(a, 4)}, want: false,
					wantStates: []bucket.State{ok(4, 600*time.Millisecond), refused(4, 400*time.Millisecond, 600*time.Millisecond)}},
			},
			remaining: map[bucket.Key]uint64{a: 4},
		},
		{
			// ... and on a full bucket it returns the take's tokens rather
			// than spilling over the burst.
			name: "same key: a give back before a take on a full bucket",
			calls: []call{
				{hits: []bucket.Hit{give(a, 2), take(a, 3)}, want: true,
					wantStates: []bucket.State{ok(9, 100*time.Millisecond), ok(7, 300*time.Millisecond)}},
			},
			remaining: map[bucket.Key]uint64{a: 9},
		},
		{
			name: "same key: an independent hit never blocks a later take",
			calls: []call{
				{hits: []bucket.Hit{shadow(take(a, 5)), take(a, 8)}, want: true,
					wantStates: []bucket.State{refused(2, 300*time.Millisecond, 800*time.Millisecond), ok(2, 800*time.Millisecond)}},
			},
			remaining: map[bucket.Key]uint64{a: 2},
		},
		{
			name: "an independent refusal does not block the others",
			calls: []call{
				{hits: []bucket.Hit{take(a, 10)}, want: true},
				{hits: []bucket.Hit{shadow(take(a, 1)), take(b, 1)}, want: true,
					wantStates: []bucket.State{refused(0, 100*time.Millisecond, time.Second), ok(9, 100*time.Millisecond)}},
			},
			remaining: map[bucket.Key]uint64{a: 0, b: 9},
		},
		{
			name: "an independent hit takes its tokens even when the call is refused",
			calls: []call{
				{hits: []bucket.Hit{shadow(take(a, 3)), take(b, 11), take(c, 1)}, want: false,
					wantStates: []bucket.State{ok(7, 300*time.Millisecond), refused(10, 0, 0), ok(10, 0)}},
			},
			remaining: map[bucket.Key]uint64{a: 7, b: 10, c: 10},
		},
		{
			name: "an independent hit on a key the refused call also took is decided after the undo",
			calls: []call{
				// The take of 8 is undone before the shadow hit of 5 is
				// decided, so the shadow hit finds 10 tokens.
				{hits: []bucket.Hit{take(a, 8), shadow(take(a, 5)), take(b, 11)}, want: false,
					wantStates: []bucket.State{ok(5, 500*time.Millisecond), ok(5, 500*time.Millisecond), refused(10, 0, 0)}},
			},
			remaining: map[bucket.Key]uint64{a: 5, b: 10},
		},
		{
			name: "only independent hits: always true",
			calls: []call{
				{hits: []bucket.Hit{shadow(take(a, 11)), shadow(take(b, 1))}, want: true,
					wantStates: []bucket.State{refused(10, 0, 0), ok(9, 100*time.Millisecond)}},
			},
			remaining: map[bucket.Key]uint64{a: 10, b: 9},
		},
		{
			name: "a check-only hit refuses the call when its bucket is in debt",
			calls: []call{
				{hits: []bucket.Hit{take(a, 10)}, want: true},
				{hits: []bucket.Hit{take(b, 1), take(a, 0)}, want: true}, // empty, not in debt
				{hits: []bucket.Hit{overdraw(take(a, 1))}, want: true},
				{hits: []bucket.Hit{take(b, 1), take(a, 0)}, want: false},
			},
			remaining: map[bucket.Key]uint64{a: 0, b: 9},
		},
		{
			name: "a Requests 0 rule refuses the call",
			calls: []call{
				{hits: []bucket.Hit{take(a, 1), {Key: b, Limit: bucket.Limit{Period: time.Second, Burst: 1}, Cost: 1}}, want: false,
					wantStates: []bucket.State{ok(10, 0), refused(0, time.Second, time.Second)}},
			},
			remaining: map[bucket.Key]uint64{a: 10},
		},
		{
			name:  "no hits: allowed",
			calls: []call{{hits: nil, want: true}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			runCalls(t, New(Options{}), tt.calls, tt.remaining, tenPerSecond)
		})
	}
}

// TestHitAtManyHits covers calls with more hits than fit the on-stack undo
// log, allowed and refused.
func TestHitAtManyHits(t *testing.T) {
	t.Parallel()
	l := New(Options{})
	hits := make([]bucket.Hit, 3*stackHits)
	for i := range hits {
		hits[i] = bucket.Hit{Key: key(uint64(i % (2 * stackHits))), Limit: tenPerSecond, Cost: 1}
	}
	states := make([]bucket.State, len(hits))
	for i := range 5 {
		if !l.HitAt(t0, hits, states) {
			t.Fatalf("call %d: refused, states %+v", i, states)
		}
	}
	// Keys 0..15 have been hit 10 times and are empty; the call is refused
	// and must leave every bucket as it was.
	before := l.Len()
	if l.HitAt(t0, hits, states) {
		t.Fatalf("call 6: allowed, want refused")
	}
	for i, st := range states {
		want := uint64(0)
		if i%(2*stackHits) >= stackHits {
			want = 5
		}
		if st.Remaining != want {
			t.Errorf("state %d: Remaining = %d, want %d", i, st.Remaining, want)
		}
	}
	if got := l.Len(); got != before {
		t.Errorf("Len = %d after a refused call, want %d", got, before)
	}
}

func TestHitUsesClock(t *testing.T) {
	t.Parallel()
	clock := clockwork.NewFakeClockAt(t0)
	l := New(Options{Clock: clock})
	hits := []bucket.Hit{{Key: key(1), Limit: tenPerSecond, Cost: 10}}
	states := make([]bucket.State, 1)
	ctx := context.Background()
	steps := []struct {
		advance time.Duration
		want    bool
	}{
		{0, true},
		{99 * time.Millisecond, false},
		{901 * time.Millisecond, true},
	}
	for i, s := range steps {
		clock.Advance(s.advance)
		got, err := l.Hit(ctx, hits, states)
		if err != nil || got.Allowed != s.want {
			t.Fatalf("step %d: Hit = %t, %v; want %t, nil", i, got.Allowed, err, s.want)
		}
	}
}

// TestHitAtDoesNotAllocate holds the zero-allocation promise for existing
// buckets, for a typical call and for one that needs the pooled undo log.
func TestHitAtDoesNotAllocate(t *testing.T) {
	big := bucket.Limit{Requests: 1 << 40, Period: time.Second, Burst: 1 << 40}
	for _, n := range []int{1, 3, stackHits, 4 * stackHits} {
		t.Run(fmt.Sprintf("%d hits", n), func(t *testing.T) {
			l := New(Options{})
			hits := make([]bucket.Hit, n)
			for i := range hits {
				hits[i] = bucket.Hit{Key: key(uint64(i)), Limit: big, Cost: 1}
			}
			states := make([]bucket.State, n)
			l.HitAt(t0, hits, states)
			if got := testing.AllocsPerRun(100, func() { l.HitAt(t0, hits, states) }); got != 0 {
				t.Errorf("HitAt(%d existing buckets) allocates %v times, want 0", n, got)
			}
			refuse := append(hits[:n:n], bucket.Hit{Key: key(1 << 40), Limit: tenPerSecond, Cost: 11})
			states = append(states, bucket.State{})
			if got := testing.AllocsPerRun(100, func() { l.HitAt(t0, refuse, states) }); got != 0 {
				t.Errorf("refused HitAt(%d existing buckets) allocates %v times, want 0", n, got)
			}
		})
	}
}

// TestHitAtConcurrent races many goroutines on shared buckets and requires
// the admitted total to match the tokens that exist: with a frozen clock,
// exactly the burst; with a moving one, at most burst plus refill.
func TestHitAtConcurrent(t *testing.T) {
	t.Parallel()
	const (
		goroutines = 16
		calls      = 2000
	)
	hot := bucket.Limit{Requests: 100, Period: time.Second, Burst: 50}
	roomy := bucket.Limit{Requests: 1 << 30, Period: time.Second, Burst: 1 << 30}
	tests := []struct {
		name    string
		advance time.Duration // per call, by every goroutine
	}{
		{"frozen clock", 0},
		{"moving clock", 7 * time.Microsecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clock := clockwork.NewFakeClockAt(t0)
			l := New(Options{Clock: clock})
			keys := keysInDistinctShards(t, l, 6) // 3 hot, 3 roomy
			var admitted atomic.Uint64
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					// Each call takes from two shared buckets and one of the
					// goroutine's own, in an order that varies, so lock
					// ordering and rollback are both exercised.
					own := key(uint64(1000 + g))
					hits := []bucket.Hit{
						{Key: keys[g%3], Limit: hot, Cost: 1},
						{Key: own, Limit: roomy, Cost: 1},
						{Key: keys[3+(g+1)%3], Limit: roomy, Cost: 1},
					}
					states := make([]bucket.State, len(hits))
					for range calls {
						clock.Advance(tt.advance)
						if ok, _ := l.Hit(context.Background(), hits, states); ok.Allowed {
							admitted.Add(1)
						}
					}
				})
			}
			wg.Wait()
			elapsed := clock.Since(t0)
			// Each goroutine's hot key is one of three buckets, each with
			// its own burst and refill.
			limit := 3 * (hot.Burst + uint64(elapsed*time.Duration(hot.Requests)/hot.Period))
			got := admitted.Load()
			if got > limit {
				t.Errorf("admitted %d calls in %v, more than the %d tokens that exist", got, elapsed, limit)
			}
			if tt.advance == 0 && got != limit {
				t.Errorf("admitted %d calls with a frozen clock, want exactly the burst %d", got, limit)
			}
		})
	}
}

func BenchmarkHitAt(b *testing.B) {
	roomy := bucket.Limit{Requests: 1 << 40, Period: time.Second, Burst: 1 << 40}
	hitsFor := func(keys ...bucket.Key) []bucket.Hit {
		hits := make([]bucket.Hit, len(keys))
		for i, k := range keys {
			hits[i] = bucket.Hit{Key: k, Limit: roomy, Cost: 1}
		}
		return hits
	}
	b.Run("serial/3 existing keys", func(b *testing.B) {
		b.ReportAllocs()
		l := New(Options{})
		hits := hitsFor(key(1), key(2), key(3))
		states := make([]bucket.State, len(hits))
		l.HitAt(t0, hits, states)
		b.ResetTimer()
		for b.Loop() {
			l.HitAt(t0, hits, states)
		}
	})
	b.Run("serial/3 existing keys, refused", func(b *testing.B) {
		b.ReportAllocs()
		l := New(Options{})
		hits := hitsFor(key(1), key(2), key(3))
		hits[2].Limit = onePerHour
		states := make([]bucket.State, len(hits))
		l.HitAt(t0, hits, states)
		b.ResetTimer()
		for b.Loop() {
			l.HitAt(t0, hits, states)
		}
	})
	b.Run("parallel/3 distinct keys per goroutine", func(b *testing.B) {
		b.ReportAllocs()
		l := New(Options{})
		var next atomic.Uint64
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			n := next.Add(1) * 3
			hits := hitsFor(key(n), key(n+1), key(n+2))
			states := make([]bucket.State, len(hits))
			l.HitAt(t0, hits, states)
			for pb.Next() {
				l.HitAt(t0, hits, states)
			}
		})
	})
	b.Run("parallel/1 hot key + 2 per goroutine", func(b *testing.B) {
		b.ReportAllocs()
		l := New(Options{})
		var next atomic.Uint64
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			n := next.Add(1) * 3
			hits := hitsFor(key(0), key(n+1), key(n+2))
			states := make([]bucket.State, len(hits))
			l.HitAt(t0, hits, states)
			for pb.Next() {
				l.HitAt(t0, hits, states)
			}
		})
	})
}

// BenchmarkHitAtNewKey inserts a new bucket per call: below capacity; at
// capacity among buckets that have refilled (each insert drops one); and at
// capacity with none refilled (each insert is refused).
func BenchmarkHitAtNewKey(b *testing.B) {
	for _, tt := range []struct {
		name       string
		maxBuckets int
		lim        bucket.Limit
		step       time.Duration // clock advance per insert
	}{
		{"below capacity", 1 << 24, onePerHour, 0},
		{"at capacity, refilled", 1 << 14, tenPerSecond, time.Millisecond},
		{"at capacity, none refilled", 1 << 14, onePerHour, 0},
	} {
		b.Run(tt.name, func(b *testing.B) {
			b.ReportAllocs()
			l := New(Options{MaxBuckets: tt.maxBuckets})
			keys := make([]bucket.Key, b.N)
			for i := range keys {
				keys[i] = key(uint64(i))
			}
			hits := []bucket.Hit{{Limit: tt.lim, Cost: 1}}
			states := make([]bucket.State, 1)
			if tt.maxBuckets < b.N { // start full
				for _, k := range fillingKeys(l, uint64(b.N)) {
					hits[0].Key = k
					l.HitAt(t0, hits, states)
				}
			}
			at := t0.Add(time.Second)
			b.ResetTimer()
			for i := range b.N {
				hits[0].Key = keys[i]
				at = at.Add(tt.step)
				l.HitAt(at, hits, states)
			}
		})
	}
}
