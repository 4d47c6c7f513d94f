package lease

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	goredis "github.com/redis/go-redis/v9"

	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/internal/redistest"
)

// BenchmarkStepPrefetch is the background step a prefetch's nudge runs,
// on a node holding pools of 10,000 keys (a client-address rule under
// load): one queued prefetch, sent to a real Redis. Its cost must not grow
// with the keys held, which only a tick looks at.
func BenchmarkStepPrefetch(b *testing.B) {
	srv := redistest.Start(b)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	b.Cleanup(func() { _ = c.Close() })
	r := redisbackend.New(redisbackend.Options{Client: c, Prefix: "bench", Timeout: time.Second, CacheSize: -1})
	b.Cleanup(r.Close)
	l := New(Options{Leaser: r, Clock: clockwork.NewFakeClock(), Period: time.Hour, EagerLeases: true})
	lim := bucket.Limit{Requests: 1 << 30, Period: time.Second, Burst: 1 << 30}
	ctx := context.Background()
	states := make([]bucket.State, 1)
	keys := make([]bucket.Key, 10000)
	for i := range keys {
		keys[i] = bucket.SumKey(fmt.Appendf(nil, "k%d", i))
		if _, err := l.Hit(ctx, []bucket.Hit{{Key: keys[i], Limit: lim, Cost: 1}}, states); err != nil {
			b.Fatal(err)
		}
	}
	if len(l.holding) != len(keys) {
		b.Fatalf("%d keys hold a pool, want %d", len(l.holding), len(keys))
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		l.mu.Lock()
		l.fetch[keys[i%len(keys)]] = true
		l.mu.Unlock()
		if err := l.step(ctx, stepFetch); err != nil {
			b.Fatal(err)
		}
	}
}
