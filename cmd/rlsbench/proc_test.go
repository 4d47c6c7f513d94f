package main

import (
	"os"
	"runtime"
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	// Fields 14 and 15 are 250 and 50 ticks; the name holds ") (" and spaces.
	stat := "4242 (rls (x) y) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 50 0 0 20 0 9 0 100 1000 200"
	got, err := parseStatCPU(stat)
	if err != nil {
		t.Fatal(err)
	}
	if want := 3 * time.Second; got != want {
		t.Errorf("parseStatCPU = %v, want %v", got, want)
	}
	for _, bad := range []string{"", "1 (x) S 1 2", "1 (x) S 1 2 3 4 5 6 7 8 9 10 x 5 0"} {
		if _, err := parseStatCPU(bad); err == nil {
			t.Errorf("parseStatCPU(%q) = nil error, want one", bad)
		}
	}
}

func TestProcessCPUOfSelf(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("/proc is Linux only")
	}
	if _, err := processCPU(os.Getpid()); err != nil {
		t.Fatal(err)
	}
}

func TestParseProcStat(t *testing.T) {
	// user 100, nice 20, system 30, idle 999, iowait 5, irq 7, softirq 9, steal 50.
	got, err := parseProcStat("cpu  100 20 30 999 5 7 9 50 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := 2 * time.Second; got != want { // 200 ticks
		t.Errorf("parseProcStat = %v, want %v", got, want)
	}
	if _, err := parseProcStat("intr 1 2 3\n"); err == nil {
		t.Error("parseProcStat without a cpu line = nil error, want one")
	}
}
