package share

import (
	"math"
	"testing"
	"time"

	"github.com/sluice-rls/sluice/bucket"
)

// The n cells and Redis' part never add up to more than the limit, in
// burst or in rate, whatever f and n; and they waste less than a token of
// burst per part.
func TestPartsAddUp(t *testing.T) {
	t.Parallel()
	limits := []bucket.Limit{
		{Requests: 10, Period: time.Second, Burst: 10},
		{Requests: 7, Period: time.Minute, Burst: 13},
		{Requests: 1, Period: 365 * 24 * time.Hour, Burst: 1},
		{Requests: math.MaxUint32, Period: time.Second, Burst: math.MaxUint32},
		{Requests: 3, Period: 100 * 365 * 24 * time.Hour, Burst: 5},
	}
	for _, lim := range limits {
		for _, f := range []uint32{1, 100_000, 333_333, 500_000, 999_999} {
			for _, n := range []int{1, 2, 3, 7, 100} {
				c, r := cellLimit(lim, f, n), redisLimit(lim, f)
				if burst := c.Burst*uint64(n) + r.Burst; burst > lim.Burst || lim.Burst-burst > uint64(n)+1 {
					t.Errorf("%+v f %d n %d: bursts %d × %d + %d, want at most %d and within n+1", lim, f, n, c.Burst, n, r.Burst, lim.Burst)
				}
				rate := func(l bucket.Limit) float64 { return float64(l.Requests) / float64(l.Period) }
				if got := rate(c)*float64(n) + rate(r); got > rate(lim)*(1+1e-12) {
					t.Errorf("%+v f %d n %d: rates %v × %d + %v above %v", lim, f, n, rate(c), n, rate(r), rate(lim))
				}
			}
		}
	}
}
