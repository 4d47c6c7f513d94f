package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/descriptors"
)

// DefaultTimeout is the deadline of every Redis call when Options.Timeout is
// zero. Envoy gives up on the rate-limit call after 20ms, and sluice must
// still answer from its fallback in time.
const DefaultTimeout = 10 * time.Millisecond

// DefaultPrefix starts every bucket key when Options.Prefix is empty.
const DefaultPrefix = "sluice"

// Options configures a Limiter.
type Options struct {
	// Client talks to Redis: a *goredis.Client, a *goredis.ClusterClient,
	// or a sentinel-backed failover client. Required.
	Client goredis.UniversalClient
	// Timeout is the deadline for every Redis call (DefaultTimeout when 0).
	Timeout time.Duration
	// Now is the node clock, used only to expire the empty-bucket cache;
	// buckets themselves run on Redis' clock. Nil means time.Now.
	Now func() time.Time
	// Prefix starts every key, as "<prefix>:{<hash>}" (DefaultPrefix when
	// empty). Nodes sharing buckets must share it. Braces in it become '_',
	// so that only the bucket's hash can be a Redis Cluster hash tag.
	Prefix string
	// CacheSize bounds the number of empty buckets remembered on the node
	// (65536 when 0); a negative value turns the cache off.
	CacheSize int
}

// routing says how hits are split into script calls.
type routing int

const (
	routeOne  routing = iota // one server (or a sentinel master): one call
	routeSlot                // Redis Cluster: one call per hash slot
	routeKey                 // a go-redis Ring shards by hash tag: one call per key
)

// Limiter holds sluice's global token buckets in Redis. Each call to Hit
// costs at most one script call per Redis Cluster slot touched (one in
// total on a single Redis or sentinel master), plus one more per slot when
// a cluster decision is refused after some slots took tokens; a decision
// refused from the empty-bucket cache costs none. It is safe for
// concurrent use.
type Limiter struct {
	client  goredis.UniversalClient
	route   routing
	timeout time.Duration
	now     func() time.Time
	prefix  string
	script  *goredis.Script
	cache   *emptyCache
}

// New returns a Limiter using opts.Client, which the caller keeps owning
// (and closes).
func New(opts Options) *Limiter {
	l := &Limiter{
		client:  opts.Client,
		timeout: opts.Timeout,
		now:     opts.Now,
		prefix:  opts.Prefix,
		script:  goredis.NewScript(tokenBucketLua),
		cache:   newEmptyCache(opts.CacheSize),
	}
	if l.timeout <= 0 {
		l.timeout = DefaultTimeout
	}
	if l.now == nil {
		l.now = time.Now
	}
	if l.prefix == "" {
		l.prefix = DefaultPrefix
	}
	l.prefix = strings.NewReplacer("{", "_", "}", "_").Replace(l.prefix)
	switch opts.Client.(type) {
	case *goredis.ClusterClient:
		l.route = routeSlot
	case *goredis.Ring:
		l.route = routeKey
	}
	return l
}

// Hit decides hits in Redis with the semantics descriptors.Hit documents and
// writes one state per hit into states, which must be at least as long. It
// returns whether the decision is allowed: every hit that is neither Give
// nor Independent had its tokens, and took them.
//
// A hit whose Limit has Requests 0 is refused without Redis (RetryAfter and
// ResetAfter one Period; a give to it does nothing). A hit on a bucket this
// node knows to be empty is refused from the cache. When a decision is
// refused without Redis, its other takes are not sent: their states are
// Allowed with zero Remaining and times, meaning "not consulted"; gives and
// Independent hits are still applied in Redis.
//
// Gives and Independent hits are applied whatever the decision. In Redis
// Cluster, takes are grouped by slot, one script call per slot runs
// concurrently, and when any slot refuses, the slots that took tokens get
// them back through a second call; the states of those hits then report the
// buckets after the refund.
//
// On error, states are undefined and the caller should fall back. Errors
// wrap context.DeadlineExceeded (the Timeout passed), ErrConnection or
// ErrScript; see ErrorKind.
func (l *Limiter) Hit(ctx context.Context, hits []descriptors.Hit, states []descriptors.BucketState) (bool, error) {
	if len(states) < len(hits) {
		return false, fmt.Errorf("backend/redis: %d states for %d hits", len(states), len(hits))
	}
	if l.client == nil {
		return false, errors.New("backend/redis: Options.Client is nil")
	}
	start := l.now()
	d := decision{hits: hits, states: states[:len(hits)]}
	allowed := l.decideLocally(&d, start)
	batches := l.group(&d)
	if len(batches) == 0 {
		return allowed, nil
	}
	if err := l.exec(ctx, batches); err != nil {
		l.refund(ctx, &d, batches, true) // best effort: the caller falls back
		return false, err
	}
	for _, b := range batches {
		if !b.fill(&d) {
			allowed = false
		}
	}
	var err error
	if !allowed && len(batches) > 1 {
		err = l.refund(ctx, &d, batches, false)
	}
	l.remember(&d, batches, start)
	return allowed, err
}

// decision is one Hit call in flight.
type decision struct {
	hits   []descriptors.Hit
	states []descriptors.BucketState
	// local marks hits decided on the node, not sent to Redis. Most
	// requests carry few descriptors, so the mask lives in a word.
	local uint64
	many  map[int]bool // the mask beyond 64 hits
}

func (d *decision) setLocal(i int) {
	if i < 64 {
		d.local |= 1 << i
		return
	}
	if d.many == nil {
		d.many = make(map[int]bool)
	}
	d.many[i] = true
}

func (d *decision) isLocal(i int) bool {
	if i < 64 {
		return d.local&(1<<i) != 0
	}
	return d.many[i]
}

// isTake reports whether h is part of the all-or-nothing set of a decision.
func isTake(h *descriptors.Hit) bool { return !h.Give && !h.Independent }

// decideLocally answers the hits the node can answer without Redis: zero
// rates and buckets known to be empty. It reports whether the decision can
// still be allowed; if not, the other takes are marked not consulted.
func (l *Limiter) decideLocally(d *decision, now time.Time) bool {
	allowed := true
	for i := range d.hits {
		h := &d.hits[i]
		if h.Limit.Requests == 0 {
			d.setLocal(i)
			if h.Give {
				d.states[i] = descriptors.BucketState{Allowed: true}
				continue
			}
			d.states[i] = descriptors.BucketState{RetryAfter: h.Limit.Period, ResetAfter: h.Limit.Period}
			if !h.Independent {
				allowed = false
			}
			continue
		}
		if !isTake(h) {
			continue
		}
		if e, ok := l.cache.get(h.Key, now); ok {
			d.setLocal(i)
			d.states[i] = cachedState(h, e, now)
			allowed = false
		}
	}
	if !allowed {
		for i := range d.hits {
			if isTake(&d.hits[i]) && !d.isLocal(i) {
				d.setLocal(i)
				d.states[i] = descriptors.BucketState{Allowed: true}
			}
		}
	}
	return allowed
}

// cachedState is the answer Redis would give for a take on a bucket known to
// be empty until e.next.
func cachedState(h *descriptors.Hit, e emptyEntry, now time.Time) descriptors.BucketState {
	reset := e.full.Sub(now)
	retry := e.next.Sub(now)
	if h.Cost > h.Limit.Burst {
		retry = reset
	} else if h.Cost > 1 {
		interval := h.Limit.Period / time.Duration(h.Limit.Requests)
		retry += time.Duration(h.Cost-1) * interval
	}
	return descriptors.BucketState{RetryAfter: retry, ResetAfter: max(reset, retry)}
}

// group splits the hits not decided locally into script calls.
func (l *Limiter) group(d *decision) []*batch {
	var batches []*batch
	for i := range d.hits {
		if d.isLocal(i) {
			continue
		}
		h := &d.hits[i]
		key, s := l.key(h.Key)
		var b *batch
		for _, c := range batches {
			if l.route == routeOne || (l.route == routeSlot && c.slot == s) ||
				(l.route == routeKey && c.bucket == h.Key) {
				b = c
				break
			}
		}
		if b == nil {
			b = &batch{slot: s, bucket: h.Key}
			batches = append(batches, b)
		}
		b.add(0, key, h, i, flags(h))
	}
	return batches
}

// key returns the Redis key of bucket k and its cluster slot. The hash is
// the whole hash tag, so whatever a client sends, only the bucket's hash
// chooses the slot.
func (l *Limiter) key(k descriptors.Key) (string, int) {
	const hexDigits = "0123456789abcdef"
	var tag [2 * len(descriptors.Key{})]byte
	for i, b := range k {
		tag[2*i], tag[2*i+1] = hexDigits[b>>4], hexDigits[b&0xf]
	}
	return l.prefix + ":{" + string(tag[:]) + "}", slot(tag[:])
}

// Script flags, as token_bucket.lua reads them.
const (
	flagGive        = 1
	flagIndependent = 2
)

func flags(h *descriptors.Hit) int {
	f := 0
	if h.Give {
		f |= flagGive
	}
	if h.Independent {
		f |= flagIndependent
	}
	return f
}

// exec runs the script calls of batches concurrently under one deadline and
// returns the first error; each batch keeps its own.
func (l *Limiter) exec(ctx context.Context, batches []*batch) error {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	if len(batches) == 1 {
		batches[0].err = l.run(ctx, batches[0])
		return batches[0].err
	}
	var wg sync.WaitGroup
	for _, b := range batches[1:] {
		wg.Go(func() { b.err = l.run(ctx, b) })
	}
	batches[0].err = l.run(ctx, batches[0])
	wg.Wait()
	for _, b := range batches {
		if b.err != nil {
			return b.err
		}
	}
	return nil
}

// run makes the script call of one batch and parses its reply.
func (l *Limiter) run(ctx context.Context, b *batch) error {
	v, err := l.script.Run(ctx, l.client, b.keys, b.args...).Result()
	if err != nil {
		return classify(ctx, "token_bucket.lua", err)
	}
	b.replies = b.replies[:0]
	b.replies = append(b.replies, make([]keyReply, len(b.keys))...)
	if err := parseReply(v, b.replies); err != nil {
		return fmt.Errorf("backend/redis: %w", err)
	}
	return nil
}

// took reports whether batch b took tokens for the decision's takes: every
// take in it was allowed (a batch is all-or-nothing) and one cost something.
func (b *batch) took(d *decision) bool {
	spent := false
	for j, i := range b.refs {
		h := &d.hits[i]
		if !isTake(h) {
			continue
		}
		if b.replies == nil || !b.replies[j].allowed {
			return false
		}
		spent = spent || h.Cost > 0
	}
	return spent
}

// refund gives back the tokens of the batches that took them, when the
// decision was refused in another slot (or failed: afterErr, best effort).
// It runs even when the caller's context is done, under its own deadline,
// and updates the states of refunded hits.
func (l *Limiter) refund(ctx context.Context, d *decision, batches []*batch, afterErr bool) error {
	var gives []*batch
	for _, b := range batches {
		if b.err != nil || !b.took(d) {
			continue
		}
		b.refunded = true
		g := &batch{slot: b.slot, bucket: b.bucket}
		for j, i := range b.refs {
			h := &d.hits[i]
			if isTake(h) && h.Cost > 0 {
				key := b.keys[j]
				g.add(0, key, h, i, flagGive|flagIndependent)
			}
		}
		gives = append(gives, g)
	}
	if len(gives) == 0 {
		return nil
	}
	err := l.exec(context.WithoutCancel(ctx), gives)
	if afterErr {
		return nil
	}
	if err != nil {
		return fmt.Errorf("backend/redis: refund after a refusal: %w", err)
	}
	for _, g := range gives {
		for j, i := range g.refs {
			r := g.replies[j]
			d.states[i].Remaining = r.remaining
			d.states[i].ResetAfter = r.reset
		}
	}
	return nil
}

// remember updates the empty-bucket cache from the replies: takes that left
// a bucket empty are remembered until its next token is due (not after a
// refund, which refilled it); gives forget their bucket.
func (l *Limiter) remember(d *decision, batches []*batch, start time.Time) {
	if l.cache == nil {
		return
	}
	for _, b := range batches {
		for j, i := range b.refs {
			h := &d.hits[i]
			r := &b.replies[j]
			switch {
			case h.Give:
				l.cache.drop(h.Key)
			case h.Independent || b.refunded:
			case r.remaining == 0 && r.next > 0:
				l.cache.put(h.Key, emptyEntry{next: start.Add(r.next), full: start.Add(r.reset)}, start)
			}
		}
	}
}
