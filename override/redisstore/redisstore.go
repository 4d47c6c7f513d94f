// Package redisstore keeps runtime overrides in Redis for a fleet of
// nodes: a hash (field: override ID, value: its JSON), a pub/sub channel
// announcing each change, and override.Manager's periodic re-read as the
// safety net for lost notifications. A change increments a generation in
// the same hash, so a node that finds the stored generation behind the one
// it applied (Redis restarted empty, flushed, restored from an old
// snapshot) writes its overrides back (Restore) without overwriting a
// newer set.
package redisstore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/override"
)

// DefaultKey is the hash holding the overrides; its channel is the key
// with ":changed" appended.
const DefaultKey = "sluice:overrides"

// GenerationField is the hash field counting changes (override.Listing's
// Generation): HINCRBY in the transaction of every Put and Delete. It is
// no override ID (those are 16 hex digits). It outlives the last override
// removed, so an operator's "rm all" leaves it, while a Redis restarted
// empty or flushed loses it with the hash: the signal that the store was
// lost, not emptied.
const GenerationField = "~generation"

// restoreScript writes a node's table back, atomically, only when the
// hash's generation is below the node's: the highest generation wins, so
// of two nodes restoring at once the one that saw more changes does, and
// a node holding a stale table never overwrites a newer one. One key,
// so it runs on Redis Cluster too.
var restoreScript = goredis.NewScript(`
local cur = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if cur >= tonumber(ARGV[2]) then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
for i = 3, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
return 1
`)

// client is the part of go-redis the store uses: a single client, a
// failover client or a cluster client all fit.
type client interface {
	HGetAll(ctx context.Context, key string) *goredis.MapStringStringCmd
	goredis.Scripter
	HDel(ctx context.Context, key string, fields ...string) *goredis.IntCmd
	TxPipelined(ctx context.Context, fn func(goredis.Pipeliner) error) ([]goredis.Cmder, error)
	Publish(ctx context.Context, channel string, message any) *goredis.IntCmd
	Subscribe(ctx context.Context, channels ...string) *goredis.PubSub
}

// Store is an override.Store in Redis.
type Store struct {
	c       client
	key     string
	channel string
	clock   clockwork.Clock
	retry   time.Duration
}

var (
	_ override.Store    = (*Store)(nil)
	_ override.Restorer = (*Store)(nil)
)

// Options configures a Store; Client is required.
type Options struct {
	Client goredis.UniversalClient
	Key    string          // the hash; empty: DefaultKey
	Clock  clockwork.Clock // times the resubscribe backoff; nil: the real clock
	// Retry is the wait between attempts to resubscribe while Redis is
	// unreachable (default DefaultRetry).
	Retry time.Duration
}

// DefaultRetry is Options.Retry's default.
const DefaultRetry = 250 * time.Millisecond

// New returns a Store with opts.
func New(opts Options) *Store {
	s := &Store{c: opts.Client, key: cmp.Or(opts.Key, DefaultKey), clock: opts.Clock, retry: opts.Retry}
	s.channel = s.key + ":changed"
	if s.clock == nil {
		s.clock = clockwork.NewRealClock()
	}
	if s.retry <= 0 {
		s.retry = DefaultRetry
	}
	return s
}

// Name returns "redis".
func (s *Store) Name() string { return "redis" }

// List reads every override from the hash. A field whose JSON does not
// decode, or names another ID, is listed as Malformed, never fails the
// read: one bad field must not freeze every other override (the Manager
// counts it, and rls override rm removes it).
func (s *Store) List(ctx context.Context) (override.Listing, error) {
	m, err := s.c.HGetAll(ctx, s.key).Result()
	if err != nil {
		return override.Listing{}, fmt.Errorf("HGETALL %s: %w", s.key, err)
	}
	var l override.Listing
	for id, v := range m {
		if id == GenerationField {
			if l.Generation, err = strconv.ParseInt(v, 10, 64); err != nil {
				l.Malformed = append(l.Malformed, override.Malformed{ID: id, Err: fmt.Sprintf("field %s of %s: not a number", id, s.key)})
			}
			continue
		}
		var o override.Override
		if err := json.Unmarshal([]byte(v), &o); err != nil {
			l.Malformed = append(l.Malformed, override.Malformed{ID: id, Err: fmt.Sprintf("field %s of %s: %v", id, s.key, err)})
			continue
		}
		if o.ID != id {
			l.Malformed = append(l.Malformed, override.Malformed{ID: id, Err: fmt.Sprintf("field %s of %s holds ID %q", id, s.key, o.ID)})
			continue
		}
		l.Overrides = append(l.Overrides, o)
	}
	slices.SortFunc(l.Overrides, func(a, b override.Override) int { return strings.Compare(a.ID, b.ID) })
	slices.SortFunc(l.Malformed, func(a, b override.Malformed) int { return strings.Compare(a.ID, b.ID) })
	return l, nil
}

// Put writes o into the hash and announces it, in one transaction.
func (s *Store) Put(ctx context.Context, o override.Override) error {
	v, err := json.Marshal(o)
	if err != nil {
		return fmt.Errorf("override %s: %w", o.ID, err)
	}
	_, err = s.c.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		p.HSet(ctx, s.key, o.ID, v)
		p.HIncrBy(ctx, s.key, GenerationField, 1)
		p.Publish(ctx, s.channel, o.ID)
		return nil
	})
	if err != nil {
		return fmt.Errorf("HSET %s %s: %w", s.key, o.ID, err)
	}
	return nil
}

// Delete removes id from the hash (counting the change) and, when it was
// there, announces it.
func (s *Store) Delete(ctx context.Context, id string) (bool, error) {
	if id == GenerationField {
		return false, nil
	}
	var del *goredis.IntCmd
	_, err := s.c.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		del = p.HDel(ctx, s.key, id)
		p.HIncrBy(ctx, s.key, GenerationField, 1)
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("HDEL %s %s: %w", s.key, id, err)
	}
	if del.Val() == 0 {
		return false, nil
	}
	// A lost announcement is not an error: removed is removed, and the
	// other nodes see it at their next re-read.
	_ = s.c.Publish(ctx, s.channel, id).Err()
	return true, nil
}

// Restore writes list back at generation gen when the hash's generation
// is lower (restoreScript), and announces it.
func (s *Store) Restore(ctx context.Context, gen int64, list []override.Override) (bool, error) {
	args := []any{GenerationField, gen}
	for _, o := range list {
		v, err := json.Marshal(o)
		if err != nil {
			return false, fmt.Errorf("override %s: %w", o.ID, err)
		}
		args = append(args, o.ID, v)
	}
	n, err := restoreScript.Run(ctx, s.c, []string{s.key}, args...).Int()
	if err != nil {
		return false, fmt.Errorf("restoring %s: %w", s.key, err)
	}
	if n == 0 {
		return false, nil
	}
	_ = s.c.Publish(ctx, s.channel, "restored").Err() // a lost announcement: the next re-read
	return true, nil
}

// Watch subscribes to the change channel and calls changed for every
// message, and once each time the subscription is (re)established (a
// message may have been lost while it was down), until ctx is done.
// go-redis reconnects the subscription; while Redis is unreachable Watch
// retries every Options.Retry.
func (s *Store) Watch(ctx context.Context, changed func()) error {
	ps := s.c.Subscribe(ctx, s.channel)
	defer ps.Close()
	// A blocked Receive does not watch ctx; closing the subscription
	// ends it.
	stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
	defer stop()
	for {
		msg, err := ps.Receive(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, goredis.ErrClosed) {
				return fmt.Errorf("SUBSCRIBE %s: %w", s.channel, err)
			}
			// go-redis reconnects the subscription on the next Receive;
			// wait a little so a dead Redis costs no busy loop.
			select {
			case <-ctx.Done():
				return nil
			case <-s.clock.After(s.retry):
			}
			continue
		}
		switch msg.(type) {
		case *goredis.Message, *goredis.Subscription:
			changed()
		}
	}
}
