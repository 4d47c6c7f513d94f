package fallback_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/fallback"
)

// TestShareCharges: while Redis is down, the share answers a postpaid
// charge as a primary would: past the limit into debt, which refuses the
// next check; and a charge sent to Redis is charged to the share too.
func TestShareCharges(t *testing.T) {
	r := newRig(t, fallback.Share)
	lim := bucket.Limit{Requests: 4, Period: time.Hour, Burst: 4}
	charge := func(cost uint64) bucket.Hit {
		return bucket.Hit{Key: bucket.Key{2}, Limit: lim, Cost: cost, Independent: true, Overdraw: true}
	}
	hit := func(h bucket.Hit) (bucket.Decision, bucket.State) {
		t.Helper()
		st := make([]bucket.State, 1)
		d, err := r.sw.Hit(context.Background(), []bucket.Hit{h}, st)
		if err != nil {
			t.Fatalf("Hit: %v", err)
		}
		return d, st[0]
	}
	// Through Redis: 3 of 4, which the share records as well.
	if d, st := hit(charge(3)); d.Answer != bucket.Decided || !st.Allowed {
		t.Fatalf("charge of 3 through Redis: %+v %+v, want Decided and allowed", d, st)
	}
	r.p.down.Store(true)
	// The share lacks 3 of 4: a charge of 3 does not fit, and is charged.
	if d, st := hit(charge(3)); d.Answer != bucket.Fallback || st.Allowed || st.Remaining != 0 {
		t.Fatalf("charge of 3 from the share: %+v %+v, want Fallback, refused, 0 left", d, st)
	}
	// 6 lacking of 4: a check is refused until 2 refilled, 30 minutes.
	d, st := hit(bucket.Hit{Key: bucket.Key{2}, Limit: lim})
	if d.Answer != bucket.Fallback || d.Allowed || st.RetryAfter <= 29*time.Minute || st.RetryAfter > 30*time.Minute {
		t.Errorf("check from the share in debt: %+v %+v, want Fallback, refused for 30m", d, st)
	}
}
