package memory

import (
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/sluice-rls/sluice/bucket"
)

// HitSince reads every bucket as empty at since: an absent (full) one
// holds what refilled after since; one in debt keeps its debt; a refused
// call stores nothing, and HitAt then sees the buckets as they were.
func TestHitSince(t *testing.T) {
	t.Parallel()
	l := New(Options{Clock: clockwork.NewFakeClockAt(t0)})
	lim := bucket.Limit{Requests: 10, Period: time.Second, Burst: 10}
	now := t0.Add(time.Hour)
	since := now.Add(-300 * time.Millisecond) // 3 tokens refilled since
	st := make([]bucket.State, 2)
	take := func(k, cost uint64) bucket.Hit { return bucket.Hit{Key: key(k), Limit: lim, Cost: cost} }

	if !l.HitSince(now, since, []bucket.Hit{take(1, 3)}, st) || st[0].Remaining != 0 {
		t.Fatalf("a take of the 3 tokens refilled since: %+v, want allowed, none left", st[0])
	}
	if l.HitSince(now, since, []bucket.Hit{take(2, 1), take(1, 1)}, st) || st[1].Allowed {
		t.Fatalf("a take beyond them: %+v, want refused", st)
	}
	if !l.HitAt(now, []bucket.Hit{take(2, 10)}, st) {
		t.Error("HitAt after a refused HitSince: key 2 is not full")
	}
	if l.HitSince(now, now.Add(time.Hour), []bucket.Hit{take(3, 1)}, st) {
		t.Error("a since after now is not read as now: a take fit")
	}

	// A bucket converted to a lowered limit lacks more than its burst:
	// emptied, it keeps that debt.
	low := bucket.Limit{Requests: 10, Period: 2 * time.Second, Burst: 5}
	l.HitAt(now, []bucket.Hit{take(4, 10)}, st) // lacks 10, 1 s to refill at 10/s
	later := now.Add(200 * time.Millisecond)    // lacks 8 of 10; of 5 at 5/s once lowered
	if l.HitSince(later, later.Add(-time.Second), []bucket.Hit{{Key: key(4), Limit: low, Cost: 1}}, st) || st[0].RetryAfter != 800*time.Millisecond {
		t.Errorf("a lowered limit: %+v, want refused for 0.8 s (a debt of 3 and a token, at 5/s), the bucket emptied a second ago but full", st[0])
	}
}
