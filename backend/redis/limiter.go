package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	goredis "github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-rls/sluice/bucket"
)

// DefaultTimeout is the deadline of every Redis call when Options.Timeout is
// zero. Envoy gives up on the rate-limit call after 20ms, and sluice must
// still answer from its fallback in time.
const DefaultTimeout = 10 * time.Millisecond

// Options configures a Limiter.
type Options struct {
	// Client talks to Redis: a *goredis.Client, a *goredis.ClusterClient,
	// or a sentinel-backed failover client. Required.
	Client goredis.UniversalClient
	// Timeout is the deadline for every Redis call, and for every Hit's
	// wait for its answer (DefaultTimeout when 0).
	Timeout time.Duration
	// Clock is the node clock, used only to expire the empty-bucket cache:
	// buckets themselves run on Redis' clock, and the Timeout bounds real
	// Redis calls, whose deadlines go-redis keeps on real time. Nil means
	// clockwork.NewRealClock().
	Clock clockwork.Clock
	// Prefix starts every key, as "<prefix>:{<hash>}" (DefaultPrefix when
	// empty). Nodes sharing buckets must share it. Braces in it become '_',
	// so that only the bucket's hash can be a Redis Cluster hash tag.
	Prefix string
	// CacheSize bounds the number of empty buckets remembered on the node
	// (65536 when 0); a negative value turns the cache off.
	CacheSize int
	// Writers bounds the script calls in flight to one Redis server (each
	// master of a Redis Cluster): requests arriving while that many are in
	// flight queue up and share the next call (DefaultWriters when 0).
	Writers int
	// Tracer writes a span (SpanScript) for each Hit that goes to Redis
	// within a traced request: one whose context holds a recording span.
	// Nil: none.
	Tracer trace.Tracer
}

// Limiter holds sluice's global token buckets in Redis. It is safe for
// concurrent use.
//
// Concurrent calls to Hit share round trips (the batcher): each Redis
// server (each master of a Redis Cluster) has a queue, and the requests
// that arrive while Options.Writers script calls to it are in flight wait
// there and go out together, several decisions in one script call,
// whatever slots of that master their buckets hash to. There is no fixed
// wait: a request that finds the server idle is sent at once, in its own
// call. A Hit so costs at most one script call per Redis Cluster master
// touched (one in total on a single Redis or sentinel master), plus one
// more per master when a cluster decision is refused after some masters
// took tokens, and usually far less than one round trip under load; a
// decision refused from the empty-bucket cache costs none.
//
// When a call reaches a master that no longer serves one of its buckets
// (the client's slot map is stale while slots move), the script fails
// before writing anything, and its requests go again one call per slot,
// which go-redis redirects (MOVED, ASK) like any single-slot command.
//
// The writers are goroutines that exit when their queue is empty; Close
// stops the Limiter and waits for them.
type Limiter struct {
	client  goredis.UniversalClient
	cluster *goredis.ClusterClient // client, when it is one
	route   routing
	timeout time.Duration
	clock   clockwork.Clock
	keys    keyspace
	cache   *emptyCache
	tracer  trace.Tracer // nil: no spans
	sender  *sender      // makes the script calls
	batch   *batcher     // queues them, and shares them among requests
	routed  atomic.Bool  // the cluster client has loaded its slot map

	requests sync.Pool // *request
}

// New returns a Limiter using opts.Client, which the caller keeps owning
// (and closes, after Close).
func New(opts Options) *Limiter {
	l := &Limiter{
		client:  opts.Client,
		timeout: opts.Timeout,
		clock:   opts.Clock,
		keys:    newKeyspace(opts.Prefix),
		cache:   newEmptyCache(opts.CacheSize),
		tracer:  opts.Tracer,
	}
	if l.timeout <= 0 {
		l.timeout = DefaultTimeout
	}
	if l.clock == nil {
		l.clock = clockwork.NewRealClock()
	}
	writers := opts.Writers
	if writers <= 0 {
		writers = DefaultWriters
	}
	switch c := opts.Client.(type) {
	case *goredis.ClusterClient:
		l.route, l.cluster = routeSlot, c
	case *goredis.Ring:
		l.route = routeKey
	}
	l.sender = newSender(opts.Client, l.route)
	l.batch = newBatcher(l.sender.send, writers, l.timeout)
	l.requests.New = func() any { return newRequest(&l.requests) }
	return l
}

// Close stops the Limiter: later calls to Hit fail with ErrConnection, so
// do the requests still queued, and Close returns once the script calls in
// flight have ended (each within the Timeout) and every writer goroutine
// has exited. After it, the Limiter no longer uses the client, which its
// owner then closes. Calling Close again does nothing more.
func (l *Limiter) Close() { l.batch.close() }

// Hit decides hits in Redis with the semantics bucket.Hit documents and
// writes one state per hit into states, which must be at least as long. It
// returns whether the decision is allowed: every hit that is neither Give
// nor Independent had its tokens, and took them.
//
// A hit whose Limit has Requests 0 is refused without Redis (RetryAfter and
// ResetAfter one Period; a give to it does nothing). A hit on a bucket this
// node knows to be empty is refused from the cache. When a decision is
// refused without Redis, its other takes still go to Redis, in a decision
// that the script refuses whatever they find (refuse), so that nothing is
// taken and their states report their buckets as they are: a decision of
// one take refused so costs no Redis call, one with other takes costs the
// call a check of them would. Gives and Independent hits are applied in
// Redis whatever the decision.
//
// Gives and Independent hits are applied whatever the decision. In Redis
// Cluster, takes are grouped by master, one script call per master runs
// concurrently, and when any master refuses, the masters that took tokens
// get them back through a second call; the states of those hits then report
// the buckets after the refund.
//
// Every script call runs under the Timeout, never under ctx's deadline or
// cancellation, so that a caller giving up never makes a Redis call fail.
// A caller whose ctx ends while its decision waits in a queue leaves at
// once with ctx's error (the decision is then not sent, or its answer
// dropped); one whose call is in flight from its own goroutine waits for
// it, at most the Timeout. A ctx already done when Hit is called fails it
// without Redis. On error, states are undefined and the caller should fall
// back. Errors wrap context.DeadlineExceeded (the Timeout passed),
// ErrConnection (after Close too), ErrOOM, ErrNoPerm or ErrScript; or, when
// the caller gave up first, ErrAbandoned and ctx's error: then Redis did not
// fail (a Redis failure is reported as such even when ctx has ended since).
// See ErrorKind.
func (l *Limiter) Hit(ctx context.Context, hits []bucket.Hit, states []bucket.State) (bucket.Decision, error) {
	if len(states) < len(hits) {
		return bucket.Decision{}, fmt.Errorf("backend/redis: %d states for %d hits", len(states), len(hits))
	}
	if l.client == nil {
		return bucket.Decision{}, errors.New("backend/redis: Options.Client is nil")
	}
	if l.batch.closed.Load() {
		return bucket.Decision{}, errClosed
	}
	if err := ctx.Err(); err != nil {
		return bucket.Decision{}, fmt.Errorf("backend/redis: %w: %w", ErrAbandoned, err)
	}
	start := l.clock.Now()
	r := l.requests.Get().(*request)
	r.reset()
	r.refs.Store(1)
	r.dec.hits, r.dec.states = hits, states[:len(hits)]
	ctx, span := startSpan(ctx, l.tracer, len(hits))
	allowed, err := l.hit(ctx, r, start)
	endSpan(span, r, allowed, err)
	r.dec.hits, r.dec.states = nil, nil // the caller's: not kept in the pool
	r.release()
	return bucket.Decision{Allowed: allowed}, err
}

// Shared reports true: every node sharing the Redis uses the same buckets,
// so their keys must be the same on every node (bucket.SumKey).
func (l *Limiter) Shared() bool { return true }

// Ping checks that Redis is ready for decisions by doing what a decision
// does: it runs token_bucket.lua (EVALSHA, then EVAL when the script is not
// loaded) taking a token of a probe bucket, on a single Redis or on every
// master of a Redis Cluster, and reads the reply. So a Redis that answers
// PING but refuses the script or its write — out of memory with
// maxmemory-policy noeviction, an ACL without EVALSHA or a key command the
// script runs — fails the probe as it fails decisions, and the script is
// loaded wherever the probe passed. In a cluster each master must also
// report cluster_state:ok (a restarted master answers PING some seconds
// before it serves its slots again). Errors are classified as Hit's are
// (ErrorKind). The fail-open probe calls Ping to decide that the global
// layer is usable again.
//
// The probe bucket's key is "<prefix>:{<32 hex>}" like any bucket's,
// starting with the hex of "sluice-probe"; it expires within milliseconds.
func (l *Limiter) Ping(ctx context.Context) error {
	return ping(ctx, l.client, l.keys, l.sender.shaArg.(string))
}

// hit runs the decision of r.
func (l *Limiter) hit(ctx context.Context, r *request, start time.Time) (bool, error) {
	d := &r.dec
	allowed := l.decideLocally(d, start)
	if err := l.split(ctx, r, false); err != nil {
		return false, err
	}
	if len(r.parts) == 0 {
		return allowed, nil
	}
	err := l.batch.do(ctx, r)
	if errors.Is(err, errNotLocal) {
		// A stale slot map: nothing was written where a bucket was not
		// served. Undo what other masters took, then go slot by slot.
		l.giveBack(ctx, r, false)
		l.cluster.ReloadState(ctx)
		r.parts = r.parts[:0]
		if err = l.split(ctx, r, true); err == nil {
			err = l.batch.do(ctx, r)
		}
	}
	if err != nil {
		l.giveBack(ctx, r, false) // best effort: the caller falls back
		return false, err
	}
	for _, p := range r.parts {
		if !p.fill(d) {
			allowed = false
		}
	}
	if !allowed && len(r.parts) > 1 {
		err = l.giveBack(ctx, r, true)
	}
	l.remember(d, r, start)
	return allowed, err
}

// decideLocally answers the hits the node can answer without Redis: zero
// rates and buckets known to be empty. It reports whether the decision can
// still be allowed; if not, it marks the decision refused.
func (l *Limiter) decideLocally(d *decision, now time.Time) bool {
	allowed := true
	for i := range d.hits {
		h := &d.hits[i]
		if h.Limit.Requests == 0 {
			d.setLocal(i)
			if h.Give {
				d.states[i] = bucket.State{Allowed: true}
				continue
			}
			d.states[i] = bucket.State{RetryAfter: h.Limit.Period, ResetAfter: h.Limit.Period}
			if !h.Independent {
				allowed = false
			}
			continue
		}
		if !isTake(h) || h.Cost == 0 {
			continue // a check is refused only in debt, which the cache does not know
		}
		if e, ok := l.cache.get(h.Key, h.Limit, now); ok {
			d.setLocal(i)
			d.states[i] = cachedState(h, e, now)
			allowed = false
		}
	}
	// When refused, the other takes still go to Redis, in a call that
	// takes nothing (split), so that their states tell their buckets.
	d.refused = !allowed
	return allowed
}

// split turns the hits not decided locally into r's parts, one per script
// call, each with its queue: in Redis Cluster, one per master, or one per
// slot when bySlot is set.
func (l *Limiter) split(ctx context.Context, r *request, bySlot bool) error {
	d := &r.dec
	remote := false
	for i := range d.hits {
		if !d.isLocal(i) {
			remote = true
			break
		}
	}
	if !remote {
		return nil
	}
	// Every hit's key, in one string: one allocation per decision, and
	// substrings for the parts.
	r.buf = r.buf[:0]
	for i := range d.hits {
		r.buf = l.keys.appendKey(r.buf, d.hits[i].Key)
	}
	r.keys = string(r.buf)
	for i := range d.hits {
		if d.isLocal(i) {
			continue
		}
		h := &d.hits[i]
		key := r.keys[i*l.keys.keyLen : (i+1)*l.keys.keyLen]
		p, err := l.partFor(ctx, r, key, h.Key, bySlot)
		if err != nil {
			return err
		}
		p.add(key, h, i, flags(h))
	}
	if d.refused {
		for _, p := range r.parts {
			p.refuse()
		}
	}
	return nil
}

// partFor returns the part of r that takes key (of bucket k): the only one
// on a single Redis, the one of its master (or slot, when bySlot is set) in
// a cluster, of its bucket in a Ring.
func (l *Limiter) partFor(ctx context.Context, r *request, key string, k bucket.Key, bySlot bool) (*part, error) {
	q, s := l.batch.one, 0
	if l.route == routeSlot {
		var err error
		if q, err = l.queueFor(ctx, key); err != nil {
			return nil, err
		}
		s = anySlot
		if bySlot {
			s = slot([]byte(l.keys.tag(key)))
		}
	}
	if l.route != routeKey {
		k = bucket.Key{}
	}
	for _, p := range r.parts {
		if p.queue == q && p.slot == s && p.bucket == k {
			return p, nil
		}
	}
	p := r.newPart()
	p.queue, p.slot, p.bucket = q, s, k
	return p, nil
}

// queueFor returns the queue of the cluster master that holds key.
func (l *Limiter) queueFor(ctx context.Context, key string) (*queue, error) {
	var m *goredis.Client
	var err error
	if l.routed.Load() {
		// The slot map is loaded: finding the master asks nothing of Redis.
		m, err = l.cluster.MasterForKey(ctx, key)
		if err != nil {
			err = classify(ctx, "cluster slots", err)
		}
	} else {
		// The first lookup loads the slot map: under the Timeout, not the
		// caller's deadline.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.timeout)
		m, err = l.cluster.MasterForKey(cctx, key)
		if err != nil {
			err = classify(cctx, "cluster slots", err)
		} else {
			l.routed.Store(true)
		}
		cancel()
	}
	if err != nil {
		return nil, err
	}
	return l.batch.server(m.Options().Addr), nil
}

// giveBack gives back the tokens of r's parts that took them: after the
// decision was refused in another slot (wait: it waits and updates the
// states of refunded hits), or failed (best effort: it only queues the
// refund, for the parts answered so far). It runs even when the caller's
// context is done, under its own deadline.
func (l *Limiter) giveBack(ctx context.Context, r *request, wait bool) error {
	d := &r.dec
	g := l.requests.Get().(*request)
	g.reset()
	g.refs.Store(1)
	for _, p := range r.parts {
		if !p.answered.Load() || p.err != nil || !p.took(d) {
			continue
		}
		p.refunded = true
		q := g.newPart()
		q.queue, q.slot, q.bucket = p.queue, p.slot, p.bucket
		for j, i := range p.refs {
			if i < 0 {
				continue
			}
			h := &d.hits[i]
			if isTake(h) && h.Cost > 0 {
				q.add(p.keys[j], h, i, flagGive|flagIndependent)
			}
		}
	}
	if len(g.parts) == 0 || !wait {
		if len(g.parts) > 0 {
			l.batch.post(g) // the writers recycle g
		}
		g.release()
		return nil
	}
	defer g.release()
	if err := l.batch.do(context.WithoutCancel(ctx), g); err != nil {
		return fmt.Errorf("backend/redis: refund after a refusal: %w", err)
	}
	for _, q := range g.parts {
		for j, i := range q.refs {
			d.states[i].Remaining = q.replies[j].remaining
			d.states[i].ResetAfter = q.replies[j].reset
		}
	}
	return nil
}

// remember updates the empty-bucket cache from the replies: takes that left
// a bucket empty are remembered until its next token is due (not after a
// refund, which refilled it); gives forget their bucket.
func (l *Limiter) remember(d *decision, r *request, start time.Time) {
	if l.cache == nil {
		return
	}
	for _, p := range r.parts {
		for j, i := range p.refs {
			if i < 0 {
				continue // refuse's entry
			}
			h := &d.hits[i]
			rep := &p.replies[j]
			switch {
			case h.Give:
				l.cache.drop(h.Key)
			case h.Independent || p.refunded:
			case rep.remaining == 0 && rep.next > 0:
				l.cache.put(h.Key, emptyEntry{next: start.Add(rep.next), full: start.Add(rep.reset), limit: h.Limit}, start)
			}
		}
	}
}
