// Package redislock is an adaptive.Lock in Redis: one key set with
// SET NX PX to a random token, renewed (PEXPIRE) by its holder only, and
// deleted by its holder only; a holder that stops renewing — killed,
// partitioned — loses it after its TTL and another node takes it.
package redislock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/adaptive"
)

// DefaultKey is the lock's key.
const DefaultKey = "sluice:adaptive:actor"

// holdScript takes the lock when nobody holds it, or renews it when its
// token is ours, atomically: 1 held, 0 held by another. One key, so it
// runs on Redis Cluster too. Hand-written rather than a lock library's:
// take-or-renew is one script, and the go-redis client is already here.
var holdScript = goredis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if cur then
  return 0
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
return 0
`)

// releaseScript deletes the lock if its token is ours.
var releaseScript = goredis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// Lock is an adaptive.Lock held in Redis.
type Lock struct {
	c     goredis.Scripter
	key   string
	token string
	ttl   time.Duration
}

var _ adaptive.Lock = (*Lock)(nil)

// Options configures New.
type Options struct {
	// Client is a go-redis client (single, failover or cluster). Required.
	Client goredis.Scripter
	// Key is the lock's key (default DefaultKey).
	Key string
	// Holder names this node in the token, for operators reading the key
	// (GET shows which node acts).
	Holder string
	// TTL is how long the lock lasts without a renewal (default
	// adaptive.DefaultLockTTL). Hold renews it: call Hold well within it.
	TTL time.Duration
}

// New returns a Lock with a fresh random token.
func New(opts Options) *Lock {
	if opts.Key == "" {
		opts.Key = DefaultKey
	}
	if opts.TTL <= 0 {
		opts.TTL = adaptive.DefaultLockTTL
	}
	b := make([]byte, 12)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return &Lock{c: opts.Client, key: opts.Key, token: opts.Holder + "/" + hex.EncodeToString(b), ttl: opts.TTL}
}

// Hold takes or renews the lock for TTL.
func (l *Lock) Hold(ctx context.Context) (bool, error) {
	n, err := holdScript.Run(ctx, l.c, []string{l.key}, l.token, l.ttl.Milliseconds()).Int()
	if err != nil {
		return false, err
	}
	return n == 1, nil
}

// Release deletes the lock if this node holds it.
func (l *Lock) Release(ctx context.Context) error {
	return releaseScript.Run(ctx, l.c, []string{l.key}, l.token).Err()
}
