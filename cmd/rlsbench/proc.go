package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of utime and stime in /proc/<pid>/stat: USER_HZ, 100
// on every Linux architecture Go supports.
const userHZ = 100

// processCPU returns the user+system CPU time pid has used, from
// /proc/<pid>/stat (all threads, 10ms resolution).
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("server CPU: %w", err)
	}
	return parseStatCPU(string(b))
}

// parseStatCPU reads utime and stime (fields 14 and 15) of a
// /proc/<pid>/stat line. The command name (field 2) may hold spaces and
// parentheses, so fields are counted from its last ')'.
func parseStatCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("server CPU: malformed stat %q", stat)
	}
	f := strings.Fields(stat[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0, fmt.Errorf("server CPU: stat has %d fields after the name, want ≥ 13", len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("server CPU: stat field %q: %w", s, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// machineBusy returns the CPU time all CPUs spent on processes (user, nice
// and system) or lost to the hypervisor (steal), from the first line of
// /proc/stat. Interrupt time is left out: with IRQ time accounting the
// kernel charges it to no process, so loopback traffic's softirq time would
// count as other work; without it, it is in the processes' system time.
func machineBusy() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, fmt.Errorf("machine CPU: %w", err)
	}
	return parseProcStat(string(b))
}

// parseProcStat reads the busy ticks of the "cpu" line of /proc/stat.
func parseProcStat(stat string) (time.Duration, error) {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, fmt.Errorf("machine CPU: malformed /proc/stat line %q", line)
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 8} { // user nice system steal
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("machine CPU: /proc/stat field %q: %w", f[i], err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}
