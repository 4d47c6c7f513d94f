package main

import (
	"math"
	"math/bits"
	"time"
)

// Histogram layout: log-linear, like HdrHistogram. Values (nanoseconds)
// below 2^(subBits+1) have a bucket each; above that, every power-of-two
// range is split into 2^subBits equal buckets, so a bucket is never wider
// than 1/2^subBits (0.8%) of the values it holds. Recording is an index
// computation and an increment: no allocation, no lock (each caller owns
// its histogram; they are merged after the run).
const (
	subBits   = 7
	maxValue  = int64(1) << 40 // ~18 minutes; longer values are clamped
	maxShift  = 40 - subBits - 1
	histSlots = (maxShift + 2) << subBits
)

// histogram counts latencies. The zero value is not usable; call
// newHistogram. It is not safe for concurrent use.
type histogram struct {
	counts   []uint64
	n        uint64
	min, max int64
}

func newHistogram() *histogram {
	return &histogram{counts: make([]uint64, histSlots), min: math.MaxInt64}
}

// slot is the bucket index of v ≥ 0.
func slot(v int64) int {
	shift := bits.Len64(uint64(v)) - subBits - 1
	if shift < 0 {
		shift = 0
	}
	return shift<<subBits + int(v>>shift)
}

// slotRange is the lowest value of bucket i and the bucket's width.
func slotRange(i int) (low, width int64) {
	if i < 2<<subBits {
		return int64(i), 1
	}
	shift := i>>subBits - 1
	sub := int64(i - shift<<subBits)
	return sub << shift, 1 << shift
}

// record adds one latency.
func (h *histogram) record(d time.Duration) {
	v := int64(d)
	if v < 0 {
		v = 0
	}
	if v >= maxValue {
		v = maxValue - 1
	}
	h.counts[slot(v)]++
	h.n++
	if v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
}

// merge adds o's counts to h.
func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.min = min(h.min, o.min)
	h.max = max(h.max, o.max)
}

// quantile returns the value at quantile q (0 < q ≤ 1): the middle of the
// bucket holding the ceil(q·n)-th smallest value, kept within the exact
// minimum and maximum. It is 0 for an empty histogram.
func (h *histogram) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			low, width := slotRange(i)
			v := low + (width-1)/2
			return time.Duration(min(max(v, h.min), h.max))
		}
	}
	return time.Duration(h.max)
}
