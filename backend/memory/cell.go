package memory

import (
	"math"
	"math/bits"
	"time"

	"github.com/sluice-rls/sluice/bucket"
)

// cell is one token bucket in GCRA form: the only state is the theoretical
// arrival time (TAT), the instant at which the bucket is full again. At time
// now the bucket lacks (tat-now)×Requests/Period tokens; a bucket whose TAT is
// not after now is full, which is exactly the state of an absent bucket, so a
// full bucket can be forgotten without losing anything and "is it full" is a
// single comparison.
//
// Time is counted in nanoseconds since the Limiter's epoch. One token is worth
// Period/Requests nanoseconds, which is rarely a whole number, so the TAT keeps
// its fraction of a nanosecond exactly, in units of 1/Requests ns: the TAT is
// tat + frac/Requests. All arithmetic is on integers (128-bit where products
// need it), so a bucket never drifts however long it lives.
//
// A cell also records the Limit it was last written under, because a
// bucket's key is its rule and values, not its numbers: a hit that comes
// with another Limit first converts the bucket to it (under): the tokens it
// lacks stay lacking, all of them, also beyond the new burst (a lowered
// burst never forgives what was taken; such a bucket stays empty until the
// excess refilled). Only the rate is needed to convert; the whole Limit is
// recorded, and a Limit that differs in its burst alone converts to the
// very same state.
//
// The GCRA state is a gcra of its own, and apply decides on it alone, with
// arguments few enough for Go's register ABI: deciding on the whole 40-byte
// cell spilled every call to the stack and made HitAt a third slower.
//
// A cell holds no pointers, so slabs of millions of them cost the garbage
// collector nothing to scan.
type cell struct {
	gcra
	lim bucket.Limit
}

// gcra is a bucket's state under the Limit its cell records.
type gcra struct {
	tat  int64  // whole nanoseconds since the epoch at which the bucket is full
	frac uint64 // TAT's fraction of a nanosecond, in 1/Requests ns; < Requests
}

// minTime is the TAT of an absent bucket: full at any time.
const minTime = math.MinInt64

// absent is the cell of a key without a bucket: full at any time.
var absent = cell{gcra: gcra{tat: minTime}}

// fullAt reports whether b is full at now, that is, whether it may be dropped.
func (b gcra) fullAt(now int64) bool {
	return b.tat < now || b.tat == now && b.frac == 0
}

// deficit returns how much b lacks to be full at now, in units of 1/r ns
// (one token is Period such units). It is (tat-now)×r + frac, or 0 for a
// full bucket.
func (b gcra) deficit(now int64, r uint64) u128 {
	if b.tat < now {
		return u128{}
	}
	// tat ≥ now, so the wrapping int64 difference is the exact distance;
	// frac < r under the Limit the cell records (clamped all the same).
	return mul64(uint64(b.tat-now), r).add(u128{lo: min(b.frac, r-1)})
}

// under returns b as a bucket written under lim at now, and whether that
// converted it: b itself when it was written under lim (or is full, or lim
// never allows); else the bucket that lacks, under lim, the tokens b lacks
// at now, all of them, also more than lim.Burst.
//
// Exactly: b lacks d₀ = (TAT-now)×r₀ + frac units of 1/r₀ ns, which are
// d₀/p₀ tokens (r₀ per p₀ ns is the Limit b was written under). Under r
// per p ns those take ⌈d₀×p/p₀⌉ units of 1/r ns (rounded up, so that a
// conversion never hands out a fraction of a token), never clamped to
// burst×p: nodes that disagree on a rule's burst would otherwise forgive
// the difference at every switch from the larger to the smaller (see
// docs/design.md, "A limit change"). A bucket that lacked 3 of 3/day
// lacks 3 of 4/day (1 left); one that lacked 2 of 4/day lacks 2 of 2/day
// (none left, the next in 12 hours); one that lacked 3 of 4/day lacks 3 of
// 2/day (none left until 2 refilled, 24 hours; the next in 36 hours under
// 2/day); a full bucket stays full.
//
// The refill up to now ran at the old rate: the Limit changed at an instant
// nothing recorded. Callers store the conversion before deciding (see
// Limiter.HitAt), so that from its first hit under a new Limit, refused or
// only checking, the bucket refills at the new rate.
func (b cell) under(now int64, lim bucket.Limit) (cell, bool) {
	if b.lim == lim || b.tat < now || lim.Requests == 0 || lim.Period <= 0 || lim.Burst == 0 {
		return b, false
	}
	p := uint64(lim.Period)
	d := mul64(lim.Burst, p)
	if b.lim.Requests > 0 && b.lim.Period > 0 { // else never written: read as empty
		d = mulDivCeil(b.deficit(now, b.lim.Requests), p, uint64(b.lim.Period))
	}
	return cell{gcra: bucketAt(now, d, lim.Requests), lim: lim}, true
}

// view returns the state to decide a hit under lim on: b's own when b was
// written under lim, else b converted (under).
func (b cell) view(now int64, lim bucket.Limit) gcra {
	if b.lim != lim {
		b, _ = b.under(now, lim)
	}
	return b.gcra
}

// emptyAt returns b, under lim, as a bucket that lacked lim's whole burst
// at floor (a time before now, or minTime: b itself), keeping what b lacks
// beyond that.
func (b gcra) emptyAt(floor int64, lim bucket.Limit) gcra {
	if floor == minTime || lim.Requests == 0 || lim.Period <= 0 || lim.Burst == 0 {
		return b
	}
	e := bucketAt(floor, mul64(lim.Burst, uint64(lim.Period)), lim.Requests)
	if e.tat > b.tat || e.tat == b.tat && e.frac > b.frac {
		return e
	}
	return b
}

// bucketAt returns the bucket that lacks d (in 1/r ns) at now. A TAT beyond
// the int64 range (a deficit of more than ~292 years of refill) saturates:
// the bucket then refills a little early, which is the only inexact case.
func bucketAt(now int64, d u128, r uint64) gcra {
	q, rem, ok := d.divMod(r)
	// uint64(MaxInt64)-uint64(now) wraps to the exact headroom for any now.
	if !ok || q > uint64(math.MaxInt64)-uint64(now) {
		return gcra{tat: math.MaxInt64}
	}
	return gcra{tat: now + int64(q), frac: rem}
}

// apply decides one hit of cost tokens (a give-back when give is set) under
// lim against b at now, in nanoseconds since the epoch, b being the bucket's
// state under lim (cell.view). With overdraw set (and give not), a refused
// take takes its tokens all the same, into debt: the bucket then lacks at
// most 2×Burst tokens, and never less than before (bucket.Hit's Overdraw).
// It is a pure function: it returns the state after the hit, the state to
// report, and whether the bucket changed (only then must the caller store
// next, under lim).
//
// An absent bucket is passed as gcra{tat: minTime}.
func apply(b gcra, lim bucket.Limit, now int64, cost uint64, give, overdraw bool) (next gcra, st bucket.State, changed bool) {
	if lim.Requests == 0 || lim.Period <= 0 || lim.Burst == 0 {
		// Never allows. There is no "full" to wait for, so a refusal asks to
		// come back after one Period, as a fixed window would.
		period := max(lim.Period, 0)
		st = bucket.State{Allowed: give, ResetAfter: period}
		if !give {
			st.RetryAfter = period
		}
		return b, st, false
	}
	r, p, burst := lim.Requests, uint64(lim.Period), lim.Burst
	d := b.deficit(now, r)
	switch {
	case give:
		// Subtraction saturates at 0: a give-back never fills above Burst.
		d = d.sub(mul64(cost, p))
		st.Allowed = true
		changed = cost > 0
	case cost > burst:
		// Never satisfiable; the soonest anything changes is when full.
		if overdraw {
			d, changed = overdrawn(d, cost, p, burst)
		}
		st.RetryAfter = duration(d.ceilDiv(r))
	default:
		// Cost 0 checks for debt and takes nothing.
		room := mul64(burst-cost, p) // largest deficit that still allows
		if d.lessEq(room) {
			st.Allowed = true
			d = d.add(mul64(cost, p))
			changed = cost > 0
		} else {
			if overdraw {
				d, changed = overdrawn(d, cost, p, burst)
			}
			st.RetryAfter = duration(d.sub(room).ceilDiv(r))
		}
	}
	if missing := d.ceilDiv(p); missing < burst {
		st.Remaining = burst - missing
	}
	st.ResetAfter = duration(d.ceilDiv(r))
	return bucketAt(now, d, r), st, changed
}

// overdrawn returns deficit d (in 1/r ns, a token being p of them) after a
// refused overdraw take of cost tokens: d plus the cost, at most 2×burst
// tokens, and never less than d (a bucket converted from a larger limit may
// lack more already: the bound never forgives), and whether it changed.
func overdrawn(d u128, cost, p, burst uint64) (u128, bool) {
	bound := mul64(burst, p).add(mul64(burst, p))
	next := d.add(mul64(cost, p))
	if bound.less(next) {
		next = bound
	}
	if next.lessEq(d) {
		return d, false
	}
	return next, true
}

// duration converts nanoseconds to a Duration, saturating at its maximum.
func duration(ns uint64) time.Duration {
	return time.Duration(min(ns, math.MaxInt64))
}

// u128 is an unsigned 128-bit integer. Deficits are counted in 1/Requests ns,
// so a product such as Burst×Period needs up to 128 bits; two uint64 hold
// every such product exactly, where a float64 would round.
type u128 struct{ hi, lo uint64 }

// mul64 returns a×b exactly.
func mul64(a, b uint64) u128 {
	hi, lo := bits.Mul64(a, b)
	return u128{hi, lo}
}

// add returns x+y, saturating at 2¹²⁸-1.
func (x u128) add(y u128) u128 {
	lo, c := bits.Add64(x.lo, y.lo, 0)
	hi, c := bits.Add64(x.hi, y.hi, c)
	if c != 0 {
		return u128{math.MaxUint64, math.MaxUint64}
	}
	return u128{hi, lo}
}

// sub returns x-y, or 0 when y > x.
func (x u128) sub(y u128) u128 {
	lo, b := bits.Sub64(x.lo, y.lo, 0)
	hi, b := bits.Sub64(x.hi, y.hi, b)
	if b != 0 {
		return u128{}
	}
	return u128{hi, lo}
}

// mulDivCeil returns ⌈x×m/d⌉ through a 192-bit product, saturating at
// 2¹²⁸-1 when the quotient needs more than 128 bits (d must not be 0).
func mulDivCeil(x u128, m, d uint64) u128 {
	// x×m = w2·2¹²⁸ + w1·2⁶⁴ + w0.
	h0, w0 := bits.Mul64(x.lo, m)
	h1, l1 := bits.Mul64(x.hi, m)
	w1, c := bits.Add64(h0, l1, 0)
	w2 := h1 + c
	if w2 >= d {
		return u128{math.MaxUint64, math.MaxUint64} // the quotient needs more than 128 bits
	}
	// Long division by d, 64 bits at a time; w2 < d as the quotient fits.
	q1, rem := bits.Div64(w2, w1, d)
	q0, rem := bits.Div64(rem, w0, d)
	q := u128{q1, q0}
	if rem != 0 {
		q = q.add(u128{lo: 1})
	}
	return q
}

// less reports whether x < y.
func (x u128) less(y u128) bool {
	return x.hi < y.hi || x.hi == y.hi && x.lo < y.lo
}

// lessEq reports whether x ≤ y.
func (x u128) lessEq(y u128) bool {
	return x.hi < y.hi || x.hi == y.hi && x.lo <= y.lo
}

// divMod returns x/d and x%d; ok is false when the quotient needs more than
// 64 bits (d must not be 0).
func (x u128) divMod(d uint64) (q, r uint64, ok bool) {
	if x.hi >= d {
		return 0, 0, false
	}
	q, r = bits.Div64(x.hi, x.lo, d)
	return q, r, true
}

// ceilDiv returns ⌈x/d⌉, saturating at 2⁶⁴-1 (d must not be 0).
func (x u128) ceilDiv(d uint64) uint64 {
	q, r, ok := x.divMod(d)
	if !ok {
		return math.MaxUint64
	}
	if r != 0 && q < math.MaxUint64 {
		q++
	}
	return q
}
