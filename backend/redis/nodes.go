package redis

import (
	"context"
	_ "embed"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	goredis "github.com/redis/go-redis/v9"
)

//go:embed nodes.lua
var nodesLua string

// Heartbeat defaults: every second, expiring after three
// (docs/operations.md, "N: the node registry").
const (
	DefaultHeartbeatEvery = time.Second
	DefaultHeartbeatTTL   = 3 * time.Second
)

// NodesOptions configures Nodes.
type NodesOptions struct {
	Client  goredis.UniversalClient // required
	ID      string                  // this node's unique id (e.g. host:pid); required
	Prefix  string                  // key prefix, as Options.Prefix (DefaultPrefix when empty)
	Every   time.Duration           // heartbeat interval (DefaultHeartbeatEvery when 0)
	TTL     time.Duration           // a heartbeat's lifetime (DefaultHeartbeatTTL when 0)
	Timeout time.Duration           // deadline of one heartbeat (Every when 0)
	Clock   clockwork.Clock         // ticks the heartbeats (clockwork.NewRealClock() when nil)
}

// Nodes keeps this node registered in Redis and knows how many sluice nodes
// are alive: the N of the fallback share rate/N. It remembers the last
// count seen, so it keeps answering while Redis is down.
type Nodes struct {
	opts   NodesOptions
	key    string
	script *goredis.Script
	count  atomic.Int64
	seen   atomic.Bool // a heartbeat has succeeded
}

// NewNodes returns a registry that counts only this node until its first
// heartbeat (Seen reports whether one has succeeded).
func NewNodes(opts NodesOptions) *Nodes {
	if opts.Every <= 0 {
		opts.Every = DefaultHeartbeatEvery
	}
	if opts.TTL <= 0 {
		opts.TTL = DefaultHeartbeatTTL
	}
	if opts.Timeout <= 0 {
		opts.Timeout = opts.Every
	}
	if opts.Clock == nil {
		opts.Clock = clockwork.NewRealClock()
	}
	key := newKeyspace(opts.Prefix).prefix + ":{nodes}"
	n := &Nodes{opts: opts, key: key, script: goredis.NewScript(nodesLua)}
	n.count.Store(1)
	return n
}

// Count returns the live node count last seen (at least 1); 1 until Seen.
func (n *Nodes) Count() int { return int(max(n.count.Load(), 1)) }

// Seen reports whether a heartbeat has succeeded, so that Count is the
// registry's count rather than this node alone. Once true it stays true:
// while Redis is down Count keeps the last count seen.
func (n *Nodes) Seen() bool { return n.seen.Load() }

// Beat sends one heartbeat and updates the count.
func (n *Nodes) Beat(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, n.opts.Timeout)
	defer cancel()
	ttl := n.opts.TTL.Milliseconds()
	v, err := n.script.Run(ctx, n.opts.Client, []string{n.key}, n.opts.ID, ttl).Int64()
	if err != nil {
		return fmt.Errorf("backend/redis: heartbeat: %w", err)
	}
	n.count.Store(max(v, 1))
	n.seen.Store(true)
	return nil
}

// Run beats every Every until ctx is done, then removes this node from the
// set (best effort), so the others count it out at once. Failed heartbeats
// go to onError (may be nil); the last count is kept.
func (n *Nodes) Run(ctx context.Context, onError func(error)) {
	t := n.opts.Clock.NewTicker(n.opts.Every)
	defer t.Stop()
	for {
		if err := n.Beat(ctx); err != nil && onError != nil && ctx.Err() == nil {
			onError(err)
		}
		select {
		case <-ctx.Done():
			leave, cancel := context.WithTimeout(context.Background(), n.opts.Timeout)
			n.opts.Client.ZRem(leave, n.key, n.opts.ID)
			cancel()
			return
		case <-t.Chan():
		}
	}
}
