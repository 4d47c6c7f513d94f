package memory

import (
	"context"
	"time"
)

// DefaultEvictEvery is the eviction interval Run uses when given a
// non-positive one.
const DefaultEvictEvery = 10 * time.Second

// Run drops full buckets every interval, one shard at a time, until ctx is
// done. Full buckets are indistinguishable from absent ones, so this frees
// memory, and room for new keys in a full table, without changing any
// decision. The owner starts Run in its own goroutine and stops it by
// cancelling ctx; Run returns promptly, between shards. every ≤ 0 means
// DefaultEvictEvery.
//
// The interval is a timer of Options.Clock, armed again when a pass ends
// (so passes never queue up behind a slow one): with a fake clock, a test
// that advances it by the interval starts one pass, and the clock has a
// waiter again once that pass is over.
func (l *Limiter) Run(ctx context.Context, every time.Duration) {
	if every <= 0 {
		every = DefaultEvictEvery
	}
	timer := l.clock.NewTimer(every)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.Chan():
			l.evict(ctx, l.nanos(l.clock.Now()))
			timer.Reset(every)
		}
	}
}

// EvictAt drops every bucket that is full at now and returns how many it
// dropped. It holds one shard's lock at a time, so hits on other shards
// proceed meanwhile.
func (l *Limiter) EvictAt(now time.Time) int {
	return l.evict(context.Background(), l.nanos(now))
}

// evict is one eviction pass at t, stopping early when ctx is done.
func (l *Limiter) evict(ctx context.Context, t int64) int {
	n := 0
	for i := range l.shards {
		if ctx.Err() != nil {
			break
		}
		sh := &l.shards[i]
		sh.mu.Lock()
		n += sh.evictFull(t)
		sh.mu.Unlock()
	}
	return n
}
