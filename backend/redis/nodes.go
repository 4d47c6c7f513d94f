package redis

import (
	"context"
	_ "embed"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	goredis "github.com/redis/go-redis/v9"
)

//go:embed nodes.lua
var nodesLua string

// Heartbeat defaults: every second, expiring after three, a standing share
// ending half a second before its heartbeat expires (docs/operations.md,
// "N: the node registry").
const (
	DefaultHeartbeatEvery = time.Second
	DefaultHeartbeatTTL   = 3 * time.Second
	DefaultShareMargin    = 500 * time.Millisecond
)

// NodesOptions configures Nodes.
type NodesOptions struct {
	Client  goredis.UniversalClient // required
	ID      string                  // this node's unique id (e.g. host:pid); required
	Prefix  string                  // key prefix, as Options.Prefix (DefaultPrefix when empty)
	Every   time.Duration           // heartbeat interval (DefaultHeartbeatEvery when 0)
	TTL     time.Duration           // a heartbeat's lifetime (DefaultHeartbeatTTL when 0)
	Timeout time.Duration           // deadline of one heartbeat (Every when 0)
	// Margin: a standing share ends TTL − Margin after the last successful
	// heartbeat was sent, by Clock, so before Redis expires the heartbeat
	// (DefaultShareMargin when 0; see Share).
	Margin time.Duration
	Clock  clockwork.Clock // ticks the heartbeats and ends shares (clockwork.NewRealClock() when nil)
}

// Nodes keeps this node registered in Redis and knows how many sluice nodes
// are alive: the N of the fallback share rate/N. It remembers the last
// count seen, so it keeps answering while Redis is down. It also admits
// this process to a standing share (Share).
type Nodes struct {
	opts     NodesOptions
	key      string // the node set (Count)
	shareKey string // the share registry, in key's hash slot
	field    string // this process in the share registry: ID#incarnation
	script   *goredis.Script
	count    atomic.Int64
	seen     atomic.Bool // a heartbeat has succeeded
	share    atomic.Pointer[share]
	digest   atomic.Uint64 // this process' share digest (SetShareDigest)
	differ   atomic.Bool   // the last heartbeat saw a live process publish another digest
	kick     chan struct{} // a heartbeat is due before the next tick (cap 1)

	mu  sync.Mutex // one heartbeat (or the leave) at a time: replies apply in order
	seq int64      // the last heartbeat's sequence number
}

// share is what the last successful heartbeat said of this process' share.
type share struct {
	n      int       // the count a share is sized by
	until  time.Time // the share ends then; zero: no share
	digest uint64    // the share digest that heartbeat published
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
	if opts.Margin <= 0 {
		opts.Margin = DefaultShareMargin
	}
	if opts.Clock == nil {
		opts.Clock = clockwork.NewRealClock()
	}
	key := newKeyspace(opts.Prefix).prefix + ":{nodes}"
	n := &Nodes{
		opts: opts, key: key, shareKey: key + ":share",
		// A restarted process may reuse its ID (pid 1 in a container):
		// its share entry must not be the dead one's.
		field:  opts.ID + "#" + strconv.FormatUint(rand.Uint64(), 36),
		script: goredis.NewScript(nodesLua),
		kick:   make(chan struct{}, 1),
	}
	n.count.Store(1)
	n.share.Store(&share{n: 1})
	return n
}

// Count returns the live node count last seen (at least 1); 1 until Seen.
func (n *Nodes) Count() int { return int(max(n.count.Load(), 1)) }

// Seen reports whether a heartbeat has succeeded, so that Count is the
// registry's count rather than this node alone. Once true it stays true:
// while Redis is down Count keeps the last count seen.
func (n *Nodes) Seen() bool { return n.seen.Load() }

// SetShareDigest sets the digest of the shares this process' rules hold
// (descriptors.Config.ShareDigest; 0, the default, when none). Call it
// before the rules it describes decide: from then on Share is not ok
// until a heartbeat publishing d finds every live process publishing d
// too, so that no node holds a share while the nodes split a limit
// differently (docs/decisions/0021-standing-shares.md, "Rollout"). A
// change makes Run send a heartbeat at once.
func (n *Nodes) SetShareDigest(d uint64) {
	if n.digest.Swap(d) != d {
		select {
		case n.kick <- struct{}{}:
		default: // one is due already
		}
	}
}

// SharesDiffer reports whether the last successful heartbeat saw a live
// process publishing another share digest than this one's (no node holds
// a share then).
func (n *Nodes) SharesDiffer() bool { return n.differ.Load() }

// Share reports whether this process may hold a standing share and the node
// count n its share is sized by (its share of a rule is f/n). At every
// instant the processes holding one number at most the n each of them
// uses, so their shares add up to at most f (docs/decisions/0022-share-admission.md):
// a process is admitted only once every holder sizes by the count it
// makes; a holder grows (smaller n) only on a count Redis gave it; and ok
// ends TTL − Margin after the last successful heartbeat was sent, by this
// node's clock, before Redis expires that heartbeat and the others grow.
// Before the first heartbeat, and while Redis is unreachable for that long,
// ok is false; so it is while the share digests differ (SetShareDigest).
// A caller spends a share only right after ok: Margin also covers the
// time between the call and the spending.
func (n *Nodes) Share() (count int, ok bool) {
	return n.ShareAt(n.opts.Clock.Now())
}

// ShareAt is Share at now, an instant of the Nodes' Clock, for a caller
// that has read it already.
func (n *Nodes) ShareAt(now time.Time) (count int, ok bool) {
	s := n.share.Load()
	return s.n, now.Before(s.until) && s.digest == n.digest.Load()
}

// Beat sends one heartbeat and updates the count and the share.
func (n *Nodes) Beat(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, n.opts.Timeout)
	defer cancel()
	n.seq++
	sent := n.opts.Clock.Now()
	// The n this process sizes its share by, 0 without one: a share held
	// for another digest counts until it ends, as a call may have seen it
	// granted just before.
	ack := 0
	s, digest := n.share.Load(), n.digest.Load()
	if sent.Before(s.until) {
		ack = s.n
	}
	if s.digest != digest && !s.until.IsZero() {
		// It ends before this digest is published: whoever Redis admits
		// for this digest finds no holder of another.
		n.share.Store(&share{n: s.n})
	}
	keys := []string{n.key, n.shareKey}
	args := []any{n.opts.ID, n.opts.TTL.Milliseconds(), n.field, n.seq, ack, 0, strconv.FormatUint(digest, 16)}
	// Run by hand rather than with Script.Run: a Redis lacking the script
	// may have lost the registry, which the script must be told.
	v, err := n.script.EvalSha(ctx, n.opts.Client, keys, args...).Int64Slice()
	if goredis.HasErrorPrefix(err, "NOSCRIPT") {
		args[5] = 1
		v, err = n.script.Eval(ctx, n.opts.Client, keys, args...).Int64Slice()
	}
	if err != nil {
		return fmt.Errorf("backend/redis: heartbeat: %w", err)
	}
	if len(v) != 4 {
		return fmt.Errorf("backend/redis: heartbeat: reply %v, want 4 integers", v)
	}
	n.count.Store(max(v[0], 1))
	n.seen.Store(true)
	n.differ.Store(v[3] == 1)
	next := &share{n: int(max(v[1], 1)), digest: digest}
	if v[2] == 1 {
		next.until = sent.Add(n.opts.TTL - n.opts.Margin)
	}
	n.share.Store(next)
	return nil
}

// leave ends this process' share, then removes the node from the node set
// and the process from the share registry (best effort), so the others
// count it out at once.
func (n *Nodes) leave() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.share.Store(&share{n: n.share.Load().n})
	ctx, cancel := context.WithTimeout(context.Background(), n.opts.Timeout)
	defer cancel()
	_, _ = n.opts.Client.Pipelined(ctx, func(p goredis.Pipeliner) error {
		p.ZRem(ctx, n.key, n.opts.ID)
		p.HDel(ctx, n.shareKey, n.field)
		return nil
	})
}

// Run beats every Every, and at once when the share digest changes, until
// ctx is done, then leaves: this process' share ends and the node is
// removed from the registry (best effort), so the others count it out at
// once. Failed heartbeats go to onError (may be nil); the last count is
// kept.
func (n *Nodes) Run(ctx context.Context, onError func(error)) {
	t := n.opts.Clock.NewTicker(n.opts.Every)
	defer t.Stop()
	for {
		if err := n.Beat(ctx); err != nil && onError != nil && ctx.Err() == nil {
			onError(err)
		}
		select {
		case <-ctx.Done():
			n.leave()
			return
		case <-t.Chan():
		case <-n.kick:
		}
	}
}
