// Package redisstore keeps runtime overrides in Redis for a fleet of
// nodes: a hash (field: override ID, value: its JSON), a pub/sub channel
// announcing each change, and override.Manager's periodic re-read as the
// safety net for lost notifications.
//
// redisstore imports override and go-redis, nothing else of sluice.
package redisstore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/override"
)

// DefaultKey is the hash holding the overrides; its channel is the key
// with ":changed" appended.
const DefaultKey = "sluice:overrides"

// client is the part of go-redis the store uses: a single client, a
// failover client or a cluster client all fit.
type client interface {
	HGetAll(ctx context.Context, key string) *goredis.MapStringStringCmd
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

var _ override.Store = (*Store)(nil)

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
		p.Publish(ctx, s.channel, o.ID)
		return nil
	})
	if err != nil {
		return fmt.Errorf("HSET %s %s: %w", s.key, o.ID, err)
	}
	return nil
}

// Delete removes id from the hash and, when it was there, announces it.
func (s *Store) Delete(ctx context.Context, id string) (bool, error) {
	n, err := s.c.HDel(ctx, s.key, id).Result()
	if err != nil {
		return false, fmt.Errorf("HDEL %s %s: %w", s.key, id, err)
	}
	if n == 0 {
		return false, nil
	}
	// A lost announcement is not an error: removed is removed, and the
	// other nodes see it at their next re-read.
	_ = s.c.Publish(ctx, s.channel, id).Err()
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
