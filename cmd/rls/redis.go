package main

import (
	"context"
	"fmt"
	"log/slog"

	goredis "github.com/redis/go-redis/v9"

	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/config"
	"github.com/sluice-rls/sluice/service"
)

// newRedisGlobal connects the global layer to --redis.
func newRedisGlobal(ctx context.Context, st config.Settings, log *slog.Logger) (service.Limiter, string, func(), error) {
	opts, err := redisbackend.ParseURL(st.Redis, st.RedisTimeout)
	if err != nil {
		return nil, "", nil, fmt.Errorf("--redis: %w", err)
	}
	client := goredis.NewUniversalClient(opts)
	lim := redisbackend.New(redisbackend.Options{Client: client, Timeout: st.RedisTimeout})
	return lim, "redis", func() { _ = client.Close() }, nil
}
