package lease

import (
	"time"

	"github.com/sluice-rls/sluice/bucket"
)

// poolEnd is the end of one key's pool, as it was when the pool started.
type poolEnd struct {
	at  time.Time
	key bucket.Key
}

// poolEnds is the pools' ends by time, a container/heap min-heap: a tick
// pops the pools that ended instead of walking every pool. A pool closed
// before its end (a decision or a give on its key, a limit change) leaves
// its end in the heap: stale, it is dropped when popped (its key has no
// pool then, or one with another end). Ends are popped at the latest one
// tick after they pass, so the heap holds at most the pools started within
// about one lease period.
type poolEnds []poolEnd

// Len is heap.Interface's: the ends held.
func (h poolEnds) Len() int { return len(h) }

// Less is heap.Interface's: the earlier end first.
func (h poolEnds) Less(i, j int) bool { return h[i].at.Before(h[j].at) }

// Swap is heap.Interface's.
func (h poolEnds) Swap(i, j int) { h[i], h[j] = h[j], h[i] }

// Push is heap.Interface's: x is a poolEnd.
func (h *poolEnds) Push(x any) { *h = append(*h, x.(poolEnd)) }

// Pop is heap.Interface's: it removes the last end.
func (h *poolEnds) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
