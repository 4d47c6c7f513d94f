//go:build !linux

package service_test

// processCPU is unknown here: benchmarks report no CPU time.
func processCPU() int64 { return 0 }
