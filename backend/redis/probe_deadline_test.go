package redis_test

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/internal/redistest"
)

// TestPingWaitsForItsDeadline: Ping waits for Redis as long as its
// context allows, not only the client's read timeout (ParseURL's backstop:
// 100ms for a 10ms --redis-timeout). The fail-open switch confirms a
// suspected stall with such a probe; one cut at 100ms failed on a starved
// CPU while Redis was fine.
func TestPingWaitsForItsDeadline(t *testing.T) {
	srv := redistest.Start(t)
	opts, err := redisbackend.ParseURL("redis://"+srv.Addr()+"/0", 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	client := goredis.NewUniversalClient(opts)
	defer client.Close()
	lim := redisbackend.New(redisbackend.Options{Client: client, Timeout: 10 * time.Millisecond})
	defer lim.Close()
	setup, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := lim.Ping(setup); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	// Redis stopped for 300ms: three times the client's read timeout.
	srv.Stall()
	resumed := make(chan struct{})
	time.AfterFunc(300*time.Millisecond, func() { srv.Resume(); close(resumed) })
	defer func() { <-resumed }()
	ctx, cancelPing := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelPing()
	start := time.Now()
	err = lim.Ping(ctx)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Ping with a 5s deadline, Redis stopped for 300ms: failed after %v: %v", took, err)
	}
	if took < 250*time.Millisecond {
		t.Errorf("Ping answered after %v, while Redis was stopped for 300ms", took)
	}
	t.Logf("Ping answered after %v", took)
}
