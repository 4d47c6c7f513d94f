//go:build race

package service_test

// raceDetector: the race detector adds allocations of its own.
const raceDetector = true
