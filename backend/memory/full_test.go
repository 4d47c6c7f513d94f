package memory

import (
	"fmt"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/sluice-rls/sluice/bucket"
)

// fivePerDay is the flood's rule: one hit of cost 5 drains a bucket for a day.
var fivePerDay = bucket.Limit{Requests: 5, Period: 24 * time.Hour, Burst: 5}

// TestFloodNeverAdmitsAboveLimit is a flood of new keys, scaled down:
// a victim spends its 5/day, then 1.5 × MaxBuckets distinct keys each drain
// their bucket (cost 5), a millisecond apart so that the victim is always the
// bucket nearest to full. No drained bucket may be forgotten: the victim and
// every key the table took stay refused for the day, the keys beyond the
// table's room are refused and counted, and a check (cost 0) still answers.
// Once the buckets have refilled, new keys find room again.
func TestFloodNeverAdmitsAboveLimit(t *testing.T) {
	t.Parallel()
	const maxBuckets = 256 // 4 shards of 64
	clock := clockwork.NewFakeClockAt(t0)
	l := New(Options{MaxBuckets: maxBuckets, Clock: clock})
	hit := func(k bucket.Key, cost uint64) bucket.State {
		t.Helper()
		var st [1]bucket.State
		ok := l.HitAt(clock.Now(), []bucket.Hit{{Key: k, Limit: fivePerDay, Cost: cost}}, st[:])
		if ok != st[0].Allowed {
			t.Fatalf("HitAt = %t but its state says Allowed = %t", ok, st[0].Allowed)
		}
		return st[0]
	}

	victim := key(1 << 40)
	if st := hit(victim, 5); !st.Allowed {
		t.Fatalf("the victim's first 5 tokens were refused: %+v", st)
	}
	var admitted []bucket.Key
	refused := 0
	for i := range uint64(maxBuckets * 3 / 2) {
		clock.Advance(time.Millisecond)
		if st := hit(key(i), 5); st.Allowed {
			admitted = append(admitted, key(i))
		} else {
			refused++
			if st.Remaining != 0 || st.RetryAfter <= 0 || st.RetryAfter > 24*time.Hour {
				t.Errorf("key %d refused for a full table with state %+v; want 0 remaining and a retry within the day", i, st)
			}
		}
	}
	if got := l.Len(); got > maxBuckets {
		t.Errorf("Len() = %d, above MaxBuckets %d", got, maxBuckets)
	}
	if got, want := len(admitted)+1, l.Len(); got != want {
		t.Errorf("%d keys drained (victim included) but Len() = %d: a drained bucket was dropped", got, want)
	}
	if refused == 0 {
		t.Errorf("1.5 × MaxBuckets drained keys all admitted: the table cannot have held them")
	}
	if got := l.FullRefusals(); got != uint64(refused) {
		t.Errorf("FullRefusals() = %d, want the %d keys refused", got, refused)
	}

	// Later the same day every drained key is still drained.
	clock.Advance(time.Hour)
	victimAdmitted := 0
	for range 5 {
		if hit(victim, 1).Allowed {
			victimAdmitted++
		}
	}
	if victimAdmitted > 0 {
		t.Errorf("victim admitted %d more times within the day after spending its 5/day", victimAdmitted)
	}
	twice := 0
	for _, k := range admitted {
		if hit(k, 1).Allowed {
			twice++
		}
	}
	if twice > 0 {
		t.Errorf("%d of %d drained keys admitted again within the day", twice, len(admitted))
	}
	// A check takes nothing, so it needs no room: a new key answers full.
	if st := hit(key(1<<41), 0); !st.Allowed || st.Remaining != 5 {
		t.Errorf("check on a new key with the table full: %+v, want allowed with 5 remaining", st)
	}
	before := l.FullRefusals()
	if st := hit(key(1<<41), 1); st.Allowed {
		t.Errorf("new key admitted while the table is full of drained buckets")
	}
	if got := l.FullRefusals(); got != before+1 {
		t.Errorf("FullRefusals() = %d after one more refusal, want %d", got, before+1)
	}

	// A day later everything has refilled: the victim has its 5 tokens
	// back, and new keys take the room of refilled buckets.
	clock.Advance(24 * time.Hour)
	if st := hit(victim, 0); !st.Allowed || st.Remaining != 5 {
		t.Errorf("victim a day later: %+v, want its 5 tokens back", st)
	}
	before = l.FullRefusals()
	for i, k := range fillingKeys(l, 1<<42) {
		if st := hit(k, 5); !st.Allowed {
			t.Fatalf("new key %d refused after every bucket refilled: %+v", i, st)
		}
	}
	if got := l.FullRefusals(); got != before {
		t.Errorf("FullRefusals() grew by %d with room to spare", got-before)
	}
	if got := l.Len(); got != maxBuckets {
		t.Errorf("Len() = %d with every shard refilled and filled again, want %d", got, maxBuckets)
	}
}

// fillingKeys returns distinct keys from key(from) on, exactly as many in
// each shard of l as it holds.
func fillingKeys(l *Limiter, from uint64) []bucket.Key {
	room := make([]int, len(l.shards))
	for i := range room {
		room[i] = l.perShard
	}
	var keys []bucket.Key
	for i := from; len(keys) < len(l.shards)*l.perShard; i++ {
		k := key(i)
		if s := shardIndex(&k, l.shift); room[s] > 0 {
			room[s]--
			keys = append(keys, k)
		}
	}
	return keys
}

// TestFullTableRefusesWholeCall checks that a hit refused for lack of room
// refuses its call like any other: the other hits take nothing.
func TestFullTableRefusesWholeCall(t *testing.T) {
	t.Parallel()
	l := New(Options{MaxBuckets: minShardBuckets}) // one shard
	for i := range uint64(minShardBuckets) {
		take(t, l, 0, key(i), fivePerDay, 1)
	}
	hits := []bucket.Hit{
		{Key: key(0), Limit: fivePerDay, Cost: 1},         // has 4 tokens
		{Key: key(1 << 40), Limit: fivePerDay, Cost: 1},   // new: no room
		{Key: key(1 << 41), Limit: tenPerSecond, Cost: 1}, // new, Independent
	}
	hits[2].Independent = true
	states := make([]bucket.State, len(hits))
	if l.HitAt(t0, hits, states) {
		t.Fatalf("call with a new key admitted into a full table: %+v", states)
	}
	if states[1].Allowed || states[2].Allowed {
		t.Errorf("new keys allowed with no room: %+v", states)
	}
	if st := take(t, l, 0, key(0), fivePerDay, 0); st.Remaining != 4 {
		t.Errorf("key 0 has %d tokens after the refused call, want its 4", st.Remaining)
	}
	if got := l.FullRefusals(); got != 2 {
		t.Errorf("FullRefusals() = %d, want 2 (the new key, and the Independent one)", got)
	}
	if got := l.Len(); got != minShardBuckets {
		t.Errorf("Len() = %d, want %d", got, minShardBuckets)
	}
}

// TestFullTableRoomWhenARefills fills a one-shard table with buckets full a
// day later, except one that refills sooner, and requires a new key to be
// refused until that one has refilled and admitted within a walk's period
// after. The early bucket gets its earlier time in the ways that lower the
// shard's bound on its next refill: a give-back, and a call rolled back
// after a walk saw the bucket drained again.
func TestFullTableRoomWhenARefills(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		setup func(t *testing.T, l *Limiter, early bucket.Key)
		at    time.Duration // when a new key must find room; the early bucket is full by then
	}{
		{
			name: "give back",
			setup: func(t *testing.T, l *Limiter, early bucket.Key) {
				l.HitAt(t0, []bucket.Hit{{Key: early, Limit: fivePerDay, Cost: 4, Give: true}}, make([]bucket.State, 1))
			},
			at: 24 * time.Hour / 5,
		},
		{
			name: "rolled back after a walk",
			setup: func(t *testing.T, l *Limiter, early bucket.Key) {
				l.HitAt(t0, []bucket.Hit{{Key: early, Limit: fivePerDay, Cost: 4, Give: true}}, make([]bucket.State, 1))
				// Once early has refilled: drain it again and ask for a new
				// key, which walks the shard (nothing else is full) and is
				// refused, so the call is rolled back and early is full
				// again.
				hits := []bucket.Hit{
					{Key: early, Limit: fivePerDay, Cost: 5},
					{Key: key(1 << 41), Limit: fivePerDay, Cost: 1},
				}
				if l.HitAt(t0.Add(5*time.Hour), hits, make([]bucket.State, 2)) {
					t.Fatalf("new key admitted into a table full of drained buckets")
				}
			},
			at: 5*time.Hour + time.Minute,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l := New(Options{MaxBuckets: minShardBuckets}) // one shard
			for i := range uint64(minShardBuckets) {
				take(t, l, 0, key(i), fivePerDay, 5)
			}
			early := key(7)
			tt.setup(t, l, early)
			if st := take(t, l, time.Hour, key(1<<40), fivePerDay, 1); st.Allowed {
				t.Fatalf("new key admitted before any bucket refilled")
			}
			admitted := false
			for i := range uint64(minShardBuckets/evictScanDivisor + 1) {
				if take(t, l, tt.at+time.Second, key(1<<42+i), fivePerDay, 1).Allowed {
					admitted = true
					break
				}
			}
			if !admitted {
				t.Errorf("no new key admitted in a walk's period after a bucket refilled")
			}
			if st := take(t, l, tt.at+time.Second, early, fivePerDay, 0); st.Remaining != 5 {
				t.Errorf("early bucket has %d tokens, want 5 (full, or evicted)", st.Remaining)
			}
		})
	}
}

// TestFullTableRefusalDoesNotAllocate holds HitAt's zero-allocation promise
// on the refusal path, with the undo log on the stack and pooled.
func TestFullTableRefusalDoesNotAllocate(t *testing.T) {
	for _, n := range []int{1, 4 * stackHits} {
		t.Run(fmt.Sprintf("%d hits", n), func(t *testing.T) {
			l := New(Options{MaxBuckets: minShardBuckets})
			for i := range uint64(minShardBuckets) {
				take(t, l, 0, key(i), fivePerDay, 1)
			}
			hits := make([]bucket.Hit, n)
			for i := range hits {
				hits[i] = bucket.Hit{Key: key(uint64(i)), Limit: fivePerDay, Cost: 0}
			}
			hits[n-1] = bucket.Hit{Key: key(1 << 40), Limit: fivePerDay, Cost: 1}
			states := make([]bucket.State, n)
			l.HitAt(t0, hits, states)
			if got := testing.AllocsPerRun(100, func() { l.HitAt(t0, hits, states) }); got != 0 {
				t.Errorf("HitAt refused for room allocates %v times, want 0", got)
			}
			if states[n-1].Allowed {
				t.Errorf("new key admitted into a full table")
			}
		})
	}
}
