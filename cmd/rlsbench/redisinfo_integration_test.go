//go:build integration

package main

import (
	"context"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/internal/redistest"
)

// TestRedisProbeCountsScripts samples a real redis-server around 10 script
// calls sent as one pipeline: 10 scripts, 1 round trip (our own INFO
// commands are subtracted).
func TestRedisProbeCountsScripts(t *testing.T) {
	srv := redistest.Start(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), PoolSize: 1})
	defer c.Close()
	ctx := context.Background()
	script := goredis.NewScript(`return redis.call('INCR', KEYS[1])`)
	if err := script.Load(ctx, c).Err(); err != nil {
		t.Fatal(err)
	}
	p := &probes{redis: goredis.NewClient(&goredis.Options{Addr: srv.Addr(), PoolSize: 1})}
	defer p.redis.Close()

	pipeline := func(n int) {
		pipe := c.Pipeline()
		for range n {
			script.EvalSha(ctx, pipe, []string{"k"})
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	pipeline(1) // go-redis may open a connection (HELLO...) for its first pipeline
	p.edge(true)
	pipeline(10)
	p.edge(false)

	var o output
	if err := p.fill(&o, 10); err != nil {
		t.Fatal(err)
	}
	check := func(name string, got *float64, want float64) {
		t.Helper()
		if got == nil || *got != want {
			t.Errorf("%s per request = %v, want %v", name, deref64(got), want)
		}
	}
	check("scripts", o.RedisScripts, 1)
	check("commands (EVALSHA and INCR)", o.RedisCommands, 2)
	check("round trips", o.RedisRoundTrips, 0.1)
	if o.RedisCPUMicros == nil {
		t.Error("Redis CPU per request not sampled")
	}
}

func deref64(v *float64) any {
	if v == nil {
		return nil
	}
	return *v
}
