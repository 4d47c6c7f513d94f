// Package cputime reads the CPU time this process has used, for the
// benchmarks that report it per operation: it counts background work (GC,
// an exporter's goroutine) and not the time other processes take the CPU,
// so it moves less than wall time on a shared machine.
package cputime

import "golang.org/x/sys/unix"

// Process is the CPU time this process has used, all threads, in
// nanoseconds (0 if unknown).
func Process() int64 {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return ts.Nano()
}
