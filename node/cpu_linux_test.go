package node

import "golang.org/x/sys/unix"

// processCPU is the CPU time this process has used, all threads, in
// nanoseconds (0 if unknown): benchmarks report it per operation, as it
// counts background work (GC, a span exporter) and not the time other
// processes take the CPU.
func processCPU() int64 {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return ts.Nano()
}
