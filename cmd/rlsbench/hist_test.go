package main

import (
	"math"
	"testing"
	"time"
)

func TestSlotHoldsItsValue(t *testing.T) {
	prev := -1
	check := func(v int64) {
		t.Helper()
		i := slot(v)
		low, width := slotRange(i)
		if v < low || v >= low+width {
			t.Fatalf("slot(%d) = %d covering [%d, %d), want it to hold %d", v, i, low, low+width, v)
		}
		if width > 1 && float64(width)/float64(low) > 1.0/(1<<subBits)+1e-12 {
			t.Fatalf("slot %d: width %d over low %d is above 2^-%d", i, width, low, subBits)
		}
		if i < prev {
			t.Fatalf("slot(%d) = %d, below the previous value's slot %d", v, i, prev)
		}
		if i >= histSlots {
			t.Fatalf("slot(%d) = %d, want < %d", v, i, histSlots)
		}
		prev = i
	}
	for v := int64(0); v < 1<<16; v++ {
		check(v)
	}
	for v := int64(1 << 16); v < maxValue; v = v*9/8 + 1 {
		check(v)
	}
	check(maxValue - 1)
}

func TestQuantile(t *testing.T) {
	tests := []struct {
		name   string
		values []time.Duration // recorded once each
		q      float64
		want   time.Duration
	}{
		{"exact below 256ns: p50 of 1..100ns", series(1, 100, 1), 0.5, 50},
		{"exact below 256ns: p99 of 1..100ns", series(1, 100, 1), 0.99, 99},
		{"p50 of 1..10000µs", series(1, 10000, time.Microsecond), 0.5, 5000 * time.Microsecond},
		{"p90 of 1..10000µs", series(1, 10000, time.Microsecond), 0.9, 9000 * time.Microsecond},
		{"p99 of 1..10000µs", series(1, 10000, time.Microsecond), 0.99, 9900 * time.Microsecond},
		{"p99.9 of 1..10000µs", series(1, 10000, time.Microsecond), 0.999, 9990 * time.Microsecond},
		{"max is exact", series(1, 10000, time.Microsecond), 1, 10000 * time.Microsecond},
		{"min is exact", series(1, 10000, time.Microsecond), 0.00001, time.Microsecond},
		{"one value", []time.Duration{1234567 * time.Nanosecond}, 0.5, 1234567 * time.Nanosecond},
		{"skewed: 99 fast, 1 slow, p99", append(repeat(time.Millisecond, 99), time.Second), 0.99, time.Millisecond},
		{"skewed: 99 fast, 1 slow, p99.9", append(repeat(time.Millisecond, 99), time.Second), 0.999, time.Second},
		{"clamped above maxValue", []time.Duration{time.Hour}, 0.5, time.Duration(maxValue - 1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHistogram()
			for _, v := range tt.values {
				h.record(v)
			}
			got := h.quantile(tt.q)
			if rel := math.Abs(float64(got-tt.want)) / float64(tt.want); rel > 1.0/(1<<subBits) {
				t.Errorf("quantile(%v) = %v, want %v within %.2f%%", tt.q, got, tt.want, 100.0/(1<<subBits))
			}
		})
	}
}

func TestMergeEqualsOneHistogram(t *testing.T) {
	all, a, b := newHistogram(), newHistogram(), newHistogram()
	for i, v := range series(1, 5000, 3*time.Microsecond) {
		all.record(v)
		if i%3 == 0 {
			a.record(v)
		} else {
			b.record(v)
		}
	}
	a.merge(b)
	for _, q := range []float64{0.001, 0.5, 0.9, 0.99, 0.999, 1} {
		if got, want := a.quantile(q), all.quantile(q); got != want {
			t.Errorf("merged quantile(%v) = %v, want %v", q, got, want)
		}
	}
	if a.n != all.n {
		t.Errorf("merged count = %d, want %d", a.n, all.n)
	}
}

func TestEmptyHistogram(t *testing.T) {
	if got := newHistogram().quantile(0.99); got != 0 {
		t.Errorf("empty quantile(0.99) = %v, want 0", got)
	}
}

func BenchmarkRecord(b *testing.B) {
	b.ReportAllocs()
	h := newHistogram()
	for i := 0; b.Loop(); i++ {
		h.record(time.Duration(i&0xfffff) * time.Microsecond)
	}
}

// series is from·unit, (from+1)·unit, ..., to·unit.
func series(from, to int, unit time.Duration) []time.Duration {
	var s []time.Duration
	for i := from; i <= to; i++ {
		s = append(s, time.Duration(i)*unit)
	}
	return s
}

func repeat(v time.Duration, n int) []time.Duration {
	s := make([]time.Duration, n)
	for i := range s {
		s[i] = v
	}
	return s
}
