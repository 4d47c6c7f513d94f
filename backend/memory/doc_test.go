package memory_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-rls/sluice/backend/memory"
	"github.com/sluice-rls/sluice/bucket"
)

// A bucket of 10 tokens refilling 10 a second: ten hits pass at once, the
// eleventh must wait for the next token, 100ms later.
func Example() {
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	l := memory.New(memory.Options{})

	hits := []bucket.Hit{{
		Key:   bucket.Key{1},
		Limit: bucket.Limit{Requests: 10, Period: time.Second, Burst: 10},
		Cost:  1,
	}}
	states := make([]bucket.State, len(hits))
	for range 10 {
		l.HitAt(start, hits, states)
	}
	fmt.Println(l.HitAt(start, hits, states), states[0].RetryAfter)
	fmt.Println(l.HitAt(start.Add(100*time.Millisecond), hits, states), states[0].Remaining, states[0].ResetAfter)
	// Output:
	// false 100ms
	// true 0 1s
}

// Two hits decided together: the second bucket is empty, so the first keeps
// its token too.
func ExampleLimiter_HitAt_allOrNothing() {
	now := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	l := memory.New(memory.Options{})
	perMinute := bucket.Limit{Requests: 1, Period: time.Minute, Burst: 1}
	l.HitAt(now, []bucket.Hit{{Key: bucket.Key{2}, Limit: perMinute, Cost: 1}}, make([]bucket.State, 1))

	hits := []bucket.Hit{
		{Key: bucket.Key{1}, Limit: perMinute, Cost: 1},
		{Key: bucket.Key{2}, Limit: perMinute, Cost: 1},
	}
	states := make([]bucket.State, len(hits))
	fmt.Println(l.HitAt(now, hits, states))
	for _, st := range states {
		fmt.Printf("allowed=%t remaining=%d retry=%v\n", st.Allowed, st.Remaining, st.RetryAfter)
	}
	// Output:
	// false
	// allowed=true remaining=1 retry=0s
	// allowed=false remaining=0 retry=1m0s
}

// The owner runs the evictor beside the limiter and stops it with the
// context.
func ExampleLimiter_Run() {
	ctx, cancel := context.WithCancel(context.Background())
	l := memory.New(memory.Options{MaxBuckets: 1 << 16})
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.Run(ctx, 10*time.Second)
	}()

	d, err := l.Hit(ctx, []bucket.Hit{{
		Key:   bucket.Key{1},
		Limit: bucket.Limit{Requests: 5, Period: time.Second, Burst: 5},
		Cost:  1,
	}}, make([]bucket.State, 1))
	fmt.Println(d.Allowed, err, l.Len())

	cancel()
	<-done
	// Output:
	// true <nil> 1
}
