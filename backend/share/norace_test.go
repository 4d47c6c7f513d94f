//go:build !race

package share_test

// raceDetector: the race detector adds allocations of its own, and
// sync.Pool drops what it holds at random.
const raceDetector = false
