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

// holdingPools returns a node holding pools of n keys (a client-address
// rule under load), whose period never ends, on a real Redis.
func holdingPools(b *testing.B, n int) (*Limiter, []bucket.Key) {
	srv := redistest.Start(b)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	b.Cleanup(func() { _ = c.Close() })
	r := redisbackend.New(redisbackend.Options{Client: c, Prefix: "bench", Timeout: time.Second, CacheSize: -1})
	b.Cleanup(r.Close)
	l := New(Options{Leaser: r, Clock: clockwork.NewFakeClock(), Period: time.Hour, EagerLeases: true})
	lim := bucket.Limit{Requests: 1 << 30, Period: time.Second, Burst: 1 << 30}
	states := make([]bucket.State, 1)
	keys := make([]bucket.Key, n)
	for i := range keys {
		keys[i] = bucket.SumKey(fmt.Appendf(nil, "k%d", i))
		if _, err := l.Hit(context.Background(), []bucket.Hit{{Key: keys[i], Limit: lim, Cost: 1}}, states); err != nil {
			b.Fatal(err)
		}
	}
	pools := 0
	for _, e := range l.entries {
		if e.granted != 0 {
			pools++
		}
	}
	if pools != n {
		b.Fatalf("%d keys hold a pool, want %d", pools, n)
	}
	return l, keys
}

// BenchmarkStepPrefetch is the background step a prefetch's nudge runs,
// on a node holding pools of 10,000 keys: one queued prefetch, sent to a
// real Redis. Its cost must not grow with the keys held, which only a
// tick looks at.
func BenchmarkStepPrefetch(b *testing.B) {
	l, keys := holdingPools(b, 10000)
	ctx := context.Background()
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

// BenchmarkStepTick is Run's tick on a node holding pools of many keys,
// none of them ended: nothing to give back, no Redis call. Its cost must
// not grow with the pools held.
func BenchmarkStepTick(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("pools=%d", n), func(b *testing.B) {
			l, _ := holdingPools(b, n)
			ctx := context.Background()
			_ = l.step(ctx, stepTick) // the period's sweep of idle keys
			b.ReportAllocs()
			for b.Loop() {
				if err := l.step(ctx, stepTick); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
