package memory

import (
	"math/big"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-rls/sluice/bucket"
)

// checkSlab fails t unless every shard of l holds each of its keys in a
// slot of its own, and every other slot of its slab is on its free list
// exactly once.
func checkSlab(t *testing.T, l *Limiter) {
	t.Helper()
	for i := range l.shards {
		sh := &l.shards[i]
		owner := make([]string, len(sh.cells))
		for k, slot := range sh.m {
			if int(slot) >= len(sh.cells) || owner[slot] != "" {
				t.Fatalf("shard %d: key %x holds slot %d of %d, already %q", i, k[:8], slot, len(sh.cells), owner[slot])
			}
			owner[slot] = "key"
		}
		for f := sh.free; f != 0; f = uint32(sh.cells[f-1].frac) {
			if int(f-1) >= len(sh.cells) || owner[f-1] != "" {
				t.Fatalf("shard %d: free slot %d of %d already %q", i, f-1, len(sh.cells), owner[f-1])
			}
			owner[f-1] = "free"
		}
		for slot, o := range owner {
			if o == "" {
				t.Fatalf("shard %d: slot %d is neither a key's nor free", i, slot)
			}
		}
	}
}

// TestSlabMatchesReference drives a one-shard Limiter and the exact
// reference buckets with the same random calls: takes on one to three keys
// (all-or-nothing, so a refused call undoes the buckets its allowed takes
// created), gives that refill buckets (which frees their slots), and
// evictions. Every state must match, the slab must stay consistent, and it
// must reuse freed slots: it never holds more slots than there are keys.
func TestSlabMatchesReference(t *testing.T) {
	t.Parallel()
	const keys = 12
	lim := tenPerSecond
	l := newLimiter(Options{MaxBuckets: minShardBuckets}, 1)
	if len(l.shards) != 1 {
		t.Fatalf("%d shards, want 1", len(l.shards))
	}
	now := int64(0)
	refs := make([]*refBucket, keys)
	for i := range refs {
		refs[i] = newRefBucket(lim, now)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var hits [3]bucket.Hit
	var got, want [3]bucket.State
	undoneNew := 0 // allowed takes on absent buckets in refused calls
	for step := range 20000 {
		now += rng.Int64N(int64(100 * time.Millisecond))
		at := t0.Add(time.Duration(now))
		if rng.IntN(10) == 0 {
			l.EvictAt(at)
			full := 0
			for _, r := range refs {
				if r.hit(now, 0, false).ResetAfter == 0 {
					full++
				}
			}
			if l.Len() != keys-full {
				t.Fatalf("step %d: %d buckets held after eviction, want the %d partly drained", step, l.Len(), keys-full)
			}
			continue
		}
		if rng.IntN(5) == 0 { // a give
			k := rng.IntN(keys)
			h := bucket.Hit{Key: key(uint64(k)), Limit: lim, Cost: 1 + rng.Uint64N(5), Give: true}
			l.HitAt(at, []bucket.Hit{h}, got[:1])
			want[0] = refs[k].hit(now, h.Cost, true)
			if got[0] != want[0] {
				t.Fatalf("step %d: give %d to key %d: (-want +got):\n%s", step, h.Cost, k, cmp.Diff(want[0], got[0]))
			}
			checkSlab(t, l)
			continue
		}
		n := 1 + rng.IntN(3)
		ks := rng.Perm(keys)[:n]
		allowed := true
		absentBefore := make([]bool, n)
		trial := make([]refBucket, n) // the takes decided on copies first
		for i, k := range ks {
			hits[i] = bucket.Hit{Key: key(uint64(k)), Limit: lim, Cost: rng.Uint64N(11)}
			trial[i] = refBucket{lim: lim, tokens: new(big.Rat).Set(refs[k].tokens), last: refs[k].last}
			_, held := l.shards[0].m[hits[i].Key]
			absentBefore[i] = !held
			want[i] = trial[i].hit(now, hits[i].Cost, false)
			allowed = allowed && want[i].Allowed
		}
		for i, k := range ks {
			if allowed {
				*refs[k] = trial[i]
				continue
			}
			// Refused: the bucket as before the call.
			if want[i].Allowed && hits[i].Cost > 0 && absentBefore[i] {
				undoneNew++
			}
			st := refs[k].hit(now, 0, false)
			want[i].Remaining, want[i].ResetAfter = st.Remaining, st.ResetAfter
		}
		if ok := l.HitAt(at, hits[:n], got[:n]); ok != allowed || !slices.Equal(got[:n], want[:n]) {
			t.Fatalf("step %d: takes on keys %v: allowed %t, want %t (-want +got):\n%s", step, ks, ok, allowed, cmp.Diff(want[:n], got[:n]))
		}
		checkSlab(t, l)
	}
	if cells := len(l.shards[0].cells); cells > keys {
		t.Errorf("slab of %d slots for %d keys: freed slots not reused", cells, keys)
	}
	if undoneNew < 100 {
		t.Errorf("only %d allowed takes on a new bucket were undone, want at least 100", undoneNew)
	}
}

// TestConversionToFullFreesSlot hits a bucket under another Limit at the
// very instant it is full again: the conversion leaves it full, which frees
// its slot, and the take must then create a bucket in a slot of its own.
func TestConversionToFullFreesSlot(t *testing.T) {
	t.Parallel()
	twentyPerSecond := bucket.Limit{Requests: 20, Period: time.Second, Burst: 20}
	l := newLimiter(Options{MaxBuckets: minShardBuckets}, 1)
	take(t, l, 0, key(1), tenPerSecond, 1)  // full again at 100 ms exactly
	take(t, l, 0, key(2), tenPerSecond, 10) // another bucket, so slots matter
	if st := take(t, l, 100*time.Millisecond, key(1), twentyPerSecond, 1); !st.Allowed || st.Remaining != 19 {
		t.Fatalf("take under the new Limit: %+v, want allowed with 19 left", st)
	}
	checkSlab(t, l)
	if st := take(t, l, 100*time.Millisecond, key(1), twentyPerSecond, 0); st.Remaining != 19 {
		t.Errorf("key 1 afterwards: %+v, want 19 left", st)
	}
	if st := take(t, l, 100*time.Millisecond, key(2), tenPerSecond, 0); st.Remaining != 1 {
		t.Errorf("key 2 afterwards: %+v, want 1 left", st)
	}
}
