package clocktest

import (
	"sync"
	"testing"
	"time"
)

func TestClockMovesOnlyWhenTold(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	c := New(start)
	if got := c.Now(); !got.Equal(start) {
		t.Fatalf("Now() = %v, want the start %v", got, start)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { c.Advance(250 * time.Millisecond) })
	}
	wg.Wait()
	if got, want := c.Now(), start.Add(time.Second); !got.Equal(want) || c.Elapsed() != time.Second {
		t.Errorf("after 4 × 250ms: Now() = %v, Elapsed() = %v; want %v and 1s", got, c.Elapsed(), want)
	}
}
