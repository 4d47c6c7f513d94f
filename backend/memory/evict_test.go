package memory

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/sluice-rls/sluice/bucket"
)

// take makes one single-hit call and returns its state.
func take(t *testing.T, l *Limiter, at time.Duration, k bucket.Key, lim bucket.Limit, cost uint64) bucket.State {
	t.Helper()
	var st [1]bucket.State
	l.HitAt(t0.Add(at), []bucket.Hit{{Key: k, Limit: lim, Cost: cost}}, st[:])
	return st[0]
}

func TestEvictAt(t *testing.T) {
	t.Parallel()
	// Three buckets, full again at 100ms, 500ms and 1s.
	setup := []struct {
		key  bucket.Key
		cost uint64
	}{{key(1), 1}, {key(2), 5}, {key(3), 10}}
	tests := []struct {
		at          time.Duration
		wantEvicted int
		// wantTokens is each surviving key's whole tokens at the time.
		wantTokens map[bucket.Key]uint64
	}{
		{at: 0, wantEvicted: 0, wantTokens: map[bucket.Key]uint64{key(1): 9, key(2): 5, key(3): 0}},
		{at: 99 * time.Millisecond, wantEvicted: 0, wantTokens: map[bucket.Key]uint64{key(1): 9, key(2): 5, key(3): 0}},
		{at: 100 * time.Millisecond, wantEvicted: 1, wantTokens: map[bucket.Key]uint64{key(2): 6, key(3): 1}},
		{at: 999 * time.Millisecond, wantEvicted: 2, wantTokens: map[bucket.Key]uint64{key(3): 9}},
		{at: time.Second, wantEvicted: 3, wantTokens: map[bucket.Key]uint64{}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("at %v", tt.at), func(t *testing.T) {
			t.Parallel()
			l := New(Options{})
			for _, s := range setup {
				take(t, l, 0, s.key, tenPerSecond, s.cost)
			}
			if got := l.EvictAt(t0.Add(tt.at)); got != tt.wantEvicted {
				t.Errorf("EvictAt(+%v) = %d, want %d", tt.at, got, tt.wantEvicted)
			}
			if got, want := l.Len(), len(setup)-tt.wantEvicted; got != want {
				t.Errorf("Len() = %d after EvictAt, want %d", got, want)
			}
			// Survivors kept their state: peek without the check
			// creating anything.
			for k, want := range tt.wantTokens {
				if got := take(t, l, tt.at, k, tenPerSecond, 0).Remaining; got != want {
					t.Errorf("key %x: %d tokens after EvictAt, want %d", k[:1], got, want)
				}
			}
		})
	}
}

// TestNoFullBucketsStored checks that calls leaving a bucket full do not
// store it: check-only hits, give-backs, and refills.
func TestNoFullBucketsStored(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		hits []bucket.Hit
	}{
		{"check only", []bucket.Hit{{Key: key(1), Limit: tenPerSecond}}},
		{"give back", []bucket.Hit{{Key: key(1), Limit: tenPerSecond, Cost: 3, Give: true}}},
		{"take then give back", []bucket.Hit{
			{Key: key(1), Limit: tenPerSecond, Cost: 3},
			{Key: key(1), Limit: tenPerSecond, Cost: 3, Give: true},
		}},
		{"refused", []bucket.Hit{{Key: key(1), Limit: tenPerSecond, Cost: 11}}},
		{"rolled back", []bucket.Hit{
			{Key: key(1), Limit: tenPerSecond, Cost: 3},
			{Key: key(2), Limit: tenPerSecond, Cost: 11},
		}},
		{"requests 0", []bucket.Hit{{Key: key(1), Limit: bucket.Limit{Period: time.Second, Burst: 1}, Cost: 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l := New(Options{})
			l.HitAt(t0, tt.hits, make([]bucket.State, len(tt.hits)))
			if got := l.Len(); got != 0 {
				t.Errorf("Len() = %d, want 0", got)
			}
		})
	}
}

// TestCapacityBound inserts overfill times MaxBuckets distinct, partly
// drained buckets: Len never exceeds MaxBuckets, every shard fills to its capacity,
// no admitted bucket is dropped to make room, and every hit refused for want
// of room is counted.
func TestCapacityBound(t *testing.T) {
	t.Parallel()
	// Each call offers 3 new buckets, so overfill times MaxBuckets calls
	// offer 3 × overfill times the room: every shard overflows either way.
	// It was 10 (30 times the room), 29 s of the package's 61 under -race
	// on a loaded machine for MaxBuckets 16384.
	const overfill = 3
	for _, maxBuckets := range []int{1, 63, 64, 1000, 1 << 14} {
		t.Run(fmt.Sprintf("MaxBuckets %d", maxBuckets), func(t *testing.T) {
			t.Parallel()
			l := New(Options{MaxBuckets: maxBuckets})
			// Three keys a call, so a call can fill a shard midway.
			states := make([]bucket.State, 3)
			admitted, refused := 0, 0
			for i := range uint64(overfill * maxBuckets) {
				hits := []bucket.Hit{
					{Key: key(3 * i), Limit: onePerHour, Cost: 1},
					{Key: key(3*i + 1), Limit: onePerHour, Cost: 1},
					{Key: key(3*i + 2), Limit: onePerHour, Cost: 1},
				}
				if l.HitAt(t0, hits, states) {
					admitted += 3
				}
				for _, st := range states {
					if !st.Allowed && st.Remaining == 0 && st.RetryAfter == time.Hour {
						refused++
					}
				}
				if i%64 == 0 || int(i) > (overfill-1)*maxBuckets {
					if got := l.Len(); got > maxBuckets {
						t.Fatalf("after %d calls Len() = %d, above MaxBuckets %d", i+1, got, maxBuckets)
					}
				}
			}
			// Calls are all-or-nothing, so a shard may be left a bucket or
			// two short; single-key calls fill it.
			for i := range uint64(overfill * maxBuckets) {
				if take(t, l, 0, key(1<<40+i), onePerHour, 1).Allowed {
					admitted++
				} else {
					refused++
				}
			}
			if got, want := l.Len(), len(l.shards)*l.perShard; got != want || got != admitted {
				t.Errorf("Len() = %d at the end, want every shard full (%d) and every admitted bucket kept (%d)", got, want, admitted)
			}
			if got := l.FullRefusals(); got != uint64(refused) || refused == 0 {
				t.Errorf("FullRefusals() = %d, want the %d hits refused for want of room (> 0)", got, refused)
			}
		})
	}
}

// TestInsertEvictsFullBucketsFirst fills a shard with buckets of which some
// have refilled, then inserts: the refilled ones go and the drained survive.
func TestInsertEvictsFullBucketsFirst(t *testing.T) {
	t.Parallel()
	const capacity = minShardBuckets // a single shard
	l := New(Options{MaxBuckets: capacity})
	if len(l.shards) != 1 {
		t.Fatalf("got %d shards, want 1", len(l.shards))
	}
	// Half the keys refill within 100ms, half within an hour.
	for i := range uint64(capacity) {
		lim := onePerHour
		if i%2 == 0 {
			lim = tenPerSecond
		}
		take(t, l, 0, key(i), lim, 1)
	}
	for i := range uint64(capacity / 2) {
		take(t, l, time.Second, key(1000+i), onePerHour, 1)
	}
	if got := l.Len(); got != capacity {
		t.Errorf("Len() = %d, want %d", got, capacity)
	}
	for i := uint64(1); i < capacity; i += 2 {
		if st := take(t, l, time.Second, key(i), onePerHour, 0); st.Remaining != 0 {
			t.Errorf("drained key %d was evicted: its check says %d tokens", i, st.Remaining)
		}
	}
}

// TestRun checks that Run evicts on its clock's timer, at its clock's time,
// and stops when its context ends. Run re-arms its timer when a pass ends,
// so the fake clock having a waiter again (BlockUntilContext) says the pass
// that Advance started is over, without sleeping.
func TestRun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	clock := clockwork.NewFakeClockAt(t0)
	l := New(Options{Clock: clock})
	take(t, l, 0, key(1), tenPerSecond, 5)  // full at 500ms
	take(t, l, 0, key(2), tenPerSecond, 10) // full at 1s
	const every = 100 * time.Millisecond
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Run(runCtx, every)
	}()

	// waitArmed waits until Run's timer is armed: at the start, or once the
	// pass the last Advance started has ended.
	waitArmed := func(step string) {
		t.Helper()
		if err := clock.BlockUntilContext(ctx, 1); err != nil {
			t.Fatalf("%s: Run's timer never armed: %v", step, err)
		}
	}
	waitArmed("start")
	steps := []struct {
		advance time.Duration // from the last pass
		wantLen int
	}{
		{advance: every, wantLen: 2},      // at 100ms: nothing full
		{advance: 4 * every, wantLen: 1},  // at 500ms: key 1 full
		{advance: 15 * every, wantLen: 0}, // at 2s: both full
	}
	for i, s := range steps {
		clock.Advance(s.advance)
		waitArmed(fmt.Sprintf("pass %d", i))
		if got := l.Len(); got != s.wantLen {
			t.Errorf("pass %d at +%v: Len() = %d, want %d", i, clock.Since(t0), got, s.wantLen)
		}
	}
	stop()
	<-done
}

func TestRunStopsWithDefaultInterval(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	New(Options{}).Run(ctx, 0) // returns at once, no panic on the 0 interval
}

func BenchmarkEvictAt(b *testing.B) {
	for _, n := range []int{1 << 10, 1 << 16} {
		b.Run(fmt.Sprintf("%d buckets, none full", n), func(b *testing.B) {
			b.ReportAllocs()
			l := New(Options{})
			states := make([]bucket.State, 1)
			for i := range uint64(n) {
				l.HitAt(t0, []bucket.Hit{{Key: key(i), Limit: onePerHour, Cost: 1}}, states)
			}
			b.ResetTimer()
			for b.Loop() {
				l.EvictAt(t0)
			}
		})
	}
}
