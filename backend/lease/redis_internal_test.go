package lease

import (
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/internal/redistest"
)

// startRedis starts a redis-server owned by t and returns the Redis layer
// on it, its keys under prefix, with a second's timeout and no cache of
// empty buckets; both are closed at t's cleanup.
func startRedis(t *testing.T, prefix string) *redisbackend.Limiter {
	t.Helper()
	srv := redistest.Start(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	r := redisbackend.New(redisbackend.Options{Client: c, Prefix: prefix, Timeout: time.Second, CacheSize: -1})
	t.Cleanup(r.Close)
	return r
}
