package cputime

import "testing"

// ReportPerOp reports, as b's cpu-ns/op, the CPU time this process used
// since cpu0 (a Process reading before b's loop) divided by b.N; nothing
// when the CPU time is unknown.
func ReportPerOp(b *testing.B, cpu0 int64) {
	if cpu := Process(); cpu0 > 0 {
		b.ReportMetric(float64(cpu-cpu0)/float64(b.N), "cpu-ns/op")
	}
}
