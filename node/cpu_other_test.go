//go:build !linux

package node

// processCPU is unknown here: benchmarks report no CPU time.
func processCPU() int64 { return 0 }
