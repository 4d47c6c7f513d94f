package service

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// skewed returns a deterministic stream of n values of which value i
// (of distinct) is about twice as frequent as value i+1 beyond the first
// few: a Zipf distribution, with a long tail of rare values.
func skewed(seed uint64, n, distinct int) []string {
	r := rand.New(rand.NewPCG(seed, seed))
	z := rand.NewZipf(r, 1.2, 1, uint64(distinct-1))
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("user_id=u%d", z.Uint64())
	}
	return out
}

// TestSpaceSavingErrorBound feeds skewed streams into the top-K over
// several minutes of a fake clock and checks the documented bound against
// the true counts: every count is an upper bound at most MaxError above
// the truth, AtLeast a lower bound, MaxError ≤ N/k, and every value
// refused more than MaxError times is listed.
func TestSpaceSavingErrorBound(t *testing.T) {
	for _, tc := range []struct {
		k, perMinute, distinct, minutes, ask int
	}{
		{k: 8, perMinute: 5000, distinct: 1000, minutes: 1, ask: 1},
		{k: 32, perMinute: 20000, distinct: 5000, minutes: 3, ask: 3},
		{k: 32, perMinute: 3000, distinct: 200, minutes: 7, ask: 5}, // older minutes roll out
		{k: 4, perMinute: 1000, distinct: 50, minutes: 5, ask: 2},
	} {
		name := fmt.Sprintf("k=%d/%dx%d/ask%d", tc.k, tc.minutes, tc.perMinute, tc.ask)
		t.Run(name, func(t *testing.T) {
			clock := clockwork.NewFakeClockAt(time.Unix(1_699_999_980, 0)) // on a minute
			s := &Server{clock: clock, top: newTopRefused(tc.k, 0)}
			truth := map[string]uint64{}
			var n uint64
			for m := range tc.minutes {
				for i, v := range skewed(uint64(m+1), tc.perMinute, tc.distinct) {
					s.top.add(clock.Now(), "edge", "edge.user_id", []byte(v))
					if m >= tc.minutes-tc.ask {
						truth[v]++
						n++
					}
					if i%100 == 99 {
						clock.Advance(topWindow / time.Duration(tc.perMinute/100))
					}
				}
			}
			clock.Advance(-time.Nanosecond) // still in the last minute fed
			ans, ok := s.TopRefused("edge", "", tc.ask)
			if !ok || len(ans.Rules) != 1 {
				t.Fatalf("TopRefused: %v %+v, want one rule", ok, ans)
			}
			tr := ans.Rules[0]
			if tr.Refusals != n {
				t.Fatalf("Refusals %d, want %d (the last %d minutes)", tr.Refusals, n, tc.ask)
			}
			if bound := n / uint64(tc.k); tr.MaxError > bound {
				t.Fatalf("MaxError %d above N/k = %d", tr.MaxError, bound)
			}
			listed := map[string]bool{}
			for _, v := range tr.Values {
				listed[v.Value] = true
				f := truth[v.Value]
				if v.AtLeast > f || f > v.Count || v.Count-f > tr.MaxError {
					t.Errorf("%s: count %d, at least %d, true %d, max error %d", v.Value, v.Count, v.AtLeast, f, tr.MaxError)
				}
			}
			heavy := 0
			for v, f := range truth {
				if f > tr.MaxError {
					heavy++
					if !listed[v] {
						t.Errorf("%s refused %d times (> max error %d) is not listed", v, f, tr.MaxError)
					}
				}
			}
			if heavy == 0 {
				t.Fatalf("no value above the error bound: the stream is not skewed enough to test anything")
			}
			if len(tr.Values) > tc.k*tc.ask {
				t.Fatalf("%d values listed, more than k × minutes = %d", len(tr.Values), tc.k*tc.ask)
			}
			t.Logf("N=%d k=%d: max error %d (N/k=%d), %d values above it, %d listed; top %s %d (true %d)",
				n, tc.k, tr.MaxError, n/uint64(tc.k), heavy, len(tr.Values), tr.Values[0].Value, tr.Values[0].Count, truth[tr.Values[0].Value])
		})
	}
}

// TestTopRefusedBounded: the rules tracked are capped (the refusals of
// the others are counted as untracked) and each window holds at most k
// values however many distinct ones come.
func TestTopRefusedBounded(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Unix(1_700_000_000, 0))
	s := &Server{clock: clock, top: newTopRefused(3, 2)}
	for i := range 1000 {
		s.top.add(clock.Now(), "edge", "edge.user_id", fmt.Appendf(nil, "user_id=u%d", i))
	}
	s.top.add(clock.Now(), "edge", "edge.tenant", []byte("tenant=t"))
	s.top.add(clock.Now(), "edge", "edge.route", []byte("route=r"))
	s.top.add(clock.Now(), "other", "other.x", []byte("x=1"))
	ans, _ := s.TopRefused("", "", TopRefusedMinutes)
	if len(ans.Rules) != 2 || ans.Untracked != 2 {
		t.Fatalf("rules %d, untracked %d; want 2 rules (the cap) and 2 untracked refusals", len(ans.Rules), ans.Untracked)
	}
	r := s.top.rules[topKey{"edge", "edge.user_id"}]
	for i := range r.windows {
		if w := &r.windows[i]; len(w.ss.items) > 3 || len(w.ss.index) > 3 {
			t.Fatalf("window %d holds %d values, %d indexed; want at most k = 3", i, len(w.ss.items), len(w.ss.index))
		}
	}
	// Five minutes later every window has rolled out.
	clock.Advance(TopRefusedMinutes * topWindow)
	if ans, _ := s.TopRefused("", "", TopRefusedMinutes); len(ans.Rules) != 0 {
		t.Fatalf("after %d minutes: %+v, want no rule with refusals", TopRefusedMinutes, ans.Rules)
	}
	// The quiet rules make room for new ones (after a reload, say).
	s.top.add(clock.Now(), "other", "other.x", []byte("x=1"))
	ans, _ = s.TopRefused("", "", TopRefusedMinutes)
	if len(ans.Rules) != 1 || ans.Rules[0].Rule != "other.x" || ans.Untracked != 2 {
		t.Fatalf("a new rule once the others are quiet: %+v, want other.x tracked", ans)
	}
	// A rule refused within the windows is kept at the cap.
	clock.Advance(topWindow)
	s.top.add(clock.Now(), "edge", "edge.a", []byte("a=1"))
	s.top.add(clock.Now(), "edge", "edge.b", []byte("b=1"))
	if _, ok := s.top.rules[topKey{"other", "other.x"}]; !ok || s.top.untracked.Load() != 3 {
		t.Fatalf("other.x (refused a minute ago) dropped, or edge.b tracked beyond the cap: rules %d, untracked %d", len(s.top.rules), s.top.untracked.Load())
	}
}

// TestSpaceSavingReplacesSmallest pins the algorithm on a tiny stream.
func TestSpaceSavingReplacesSmallest(t *testing.T) {
	ss := spaceSaving{index: map[string]int{}}
	for _, v := range []string{"a", "a", "a", "b", "b", "c", "d"} {
		ss.add([]byte(v), 3)
	}
	// c (1) was the smallest when d came: d counts 2 with error 1.
	want := map[string]topItem{"a": {"a", 3, 0}, "b": {"b", 2, 0}, "d": {"d", 2, 1}}
	if len(ss.items) != 3 {
		t.Fatalf("items %+v, want 3", ss.items)
	}
	for _, it := range ss.items {
		if want[it.value] != it {
			t.Errorf("item %+v, want %+v", it, want[it.value])
		}
	}
	if f := ss.floor(3); f != 2 {
		t.Errorf("floor %d, want 2", f)
	}
}
