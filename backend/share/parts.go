package share

import (
	"math"
	"math/bits"
	"time"

	"github.com/sluice-rls/sluice/bucket"
)

// million is the denominator of a share (Rule.ShareMillionths).
const million = 1_000_000

// cellLimit returns the limit of one node's share cell of lim, for share
// f (in millionths) over n nodes: burst ⌊B × f / n⌋, refilling never
// faster than f × rate / n. Its burst is 0 when the share is less than a
// token: no cell.
func cellLimit(lim bucket.Limit, f uint32, n int) bucket.Limit {
	den := uint64(million) * uint64(max(n, 1))
	return slower(lim, den, uint64(f))
}

// redisLimit returns Redis' part of lim for share f (in millionths):
// burst ⌊B × (1 − f)⌋, refilling never faster than (1 − f) × rate. With
// every node's cell it adds up to at most lim.
func redisLimit(lim bucket.Limit, f uint32) bucket.Limit {
	return slower(lim, million, uint64(million-f))
}

// slower returns lim at num/den of its burst and rate (0 < num ≤ den),
// rounded to fewer tokens: burst ⌊B × num / den⌋, and the requests over a
// period ⌈P × den / num⌉ or, when that is no Duration, ⌊R × num / den⌋
// requests over P (0: never).
func slower(lim bucket.Limit, den, num uint64) bucket.Limit {
	out := bucket.Limit{Requests: lim.Requests, Period: lim.Period, Burst: mulDiv(lim.Burst, num, den)}
	if lim.Period <= 0 {
		return out
	}
	hi, lo := bits.Mul64(uint64(lim.Period), den)
	if hi < num {
		q, r := bits.Div64(hi, lo, num)
		if r != 0 {
			q++
		}
		if q > 0 && q <= math.MaxInt64 {
			out.Period = time.Duration(q)
			return out
		}
	}
	out.Requests = mulDiv(lim.Requests, num, den)
	return out
}

// mulDiv returns ⌊x × num / den⌋ for num ≤ den (so it fits).
func mulDiv(x, num, den uint64) uint64 {
	hi, lo := bits.Mul64(x, num)
	q, _ := bits.Div64(hi, lo, den)
	return q
}
