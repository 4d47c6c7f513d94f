package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
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

// DefaultPrefix starts every bucket key when Options.Prefix is empty.
const DefaultPrefix = "sluice"

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

// routing says how hits are split into script calls.
type routing int

const (
	routeOne  routing = iota // one server (or a sentinel master): one call
	routeSlot                // Redis Cluster: one call per master (per slot after a stale slot map)
	routeKey                 // a go-redis Ring shards by hash tag: one call per key
)

// errClosed fails Hit after Close, and the requests Close found queued.
var errClosed = fmt.Errorf("backend/redis: limiter closed: %w", ErrConnection)

// errAbandoned answers the queued parts of a caller that gave up; nobody
// reads it.
var errAbandoned = fmt.Errorf("backend/redis: %w", ErrAbandoned)

// Limiter holds sluice's global token buckets in Redis. It is safe for
// concurrent use.
//
// Concurrent calls to Hit share round trips: each Redis server (each master
// of a Redis Cluster) has a queue, and the requests that arrive while
// Options.Writers script calls to it are in flight wait there and go out
// together, several decisions in one script call, whatever slots of that
// master their buckets hash to. There is no fixed wait: a request that
// finds the server idle is sent at once, in its own call. A Hit so costs at
// most one script call per Redis Cluster master touched (one in total on a
// single Redis or sentinel master), plus one more per master when a cluster
// decision is refused after some masters took tokens, and usually far less
// than one round trip under load; a decision refused from the empty-bucket
// cache costs none.
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
	prefix  string
	keyLen  int // of every key: prefix + ":{" + 32 hex digits + "}"
	cache   *emptyCache
	writers int
	tracer  trace.Tracer // nil: no spans
	// shaArg and srcArg are the script's SHA-1 and source, converted to
	// interfaces once rather than per call.
	shaArg, srcArg any

	one       *target                            // the queue of every key, unless routeSlot
	masters   atomic.Pointer[map[string]*target] // routeSlot: queues by master address, copied on write
	mastersMu sync.Mutex                         // serialises adding masters
	routed    atomic.Bool                        // the cluster client has loaded its slot map

	requests sync.Pool // *request
	senders  sync.Pool // *sender
	closed   atomic.Bool
	inFlight sync.WaitGroup // writer goroutines and inline calls: Close waits for them
}

// New returns a Limiter using opts.Client, which the caller keeps owning
// (and closes, after Close).
func New(opts Options) *Limiter {
	l := &Limiter{
		client:  opts.Client,
		timeout: opts.Timeout,
		clock:   opts.Clock,
		prefix:  opts.Prefix,
		cache:   newEmptyCache(opts.CacheSize),
		writers: opts.Writers,
		tracer:  opts.Tracer,
		srcArg:  tokenBucketLua,
		shaArg:  goredis.NewScript(tokenBucketLua).Hash(),
	}
	if l.timeout <= 0 {
		l.timeout = DefaultTimeout
	}
	if l.clock == nil {
		l.clock = clockwork.NewRealClock()
	}
	if l.prefix == "" {
		l.prefix = DefaultPrefix
	}
	if l.writers <= 0 {
		l.writers = DefaultWriters
	}
	l.prefix = strings.NewReplacer("{", "_", "}", "_").Replace(l.prefix)
	l.keyLen = len(l.prefix) + len(":{}") + 2*len(bucket.Key{})
	switch c := opts.Client.(type) {
	case *goredis.ClusterClient:
		l.route, l.cluster = routeSlot, c
	case *goredis.Ring:
		l.route = routeKey
	}
	if l.route != routeSlot {
		l.one = &target{l: l}
	}
	l.requests.New = func() any { return newRequest() }
	l.senders.New = func() any { return new(sender) }
	return l
}

// Close stops the Limiter: later calls to Hit fail with ErrConnection, so
// do the requests still queued, and Close returns once the script calls in
// flight have ended (each within the Timeout) and every writer goroutine
// has exited. After it, the Limiter no longer uses the client, which its
// owner then closes. Calling Close again does nothing more.
func (l *Limiter) Close() {
	l.closed.Store(true)
	if l.one != nil {
		l.one.drain()
	}
	if m := l.masters.Load(); m != nil {
		for _, t := range *m {
			t.drain()
		}
	}
	l.inFlight.Wait()
}

// Hit decides hits in Redis with the semantics bucket.Hit documents and
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
	if l.closed.Load() {
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
	ctx, span := l.startSpan(ctx, len(hits))
	allowed, err := l.hit(ctx, r, start)
	endSpan(span, r, allowed, err)
	r.dec.hits, r.dec.states = nil, nil // the caller's: not kept in the pool
	l.release(r)
	return bucket.Decision{Allowed: allowed}, err
}

// Shared reports true: every node sharing the Redis uses the same buckets,
// so their keys must be the same on every node (bucket.SumKey).
func (l *Limiter) Shared() bool { return true }

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
	err := l.do(ctx, r)
	if errors.Is(err, errNotLocal) {
		// A stale slot map: nothing was written where a bucket was not
		// served. Undo what other masters took, then go slot by slot.
		l.giveBack(ctx, r, false)
		l.cluster.ReloadState(ctx)
		r.parts = r.parts[:0]
		if err = l.split(ctx, r, true); err == nil {
			err = l.do(ctx, r)
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
// still be allowed; if not, the other takes are marked not consulted.
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
				d.states[i] = bucket.State{Allowed: true}
			}
		}
	}
	return allowed
}

// cachedState is the answer Redis would give for a take on a bucket known to
// be empty until e.next.
func cachedState(h *bucket.Hit, e emptyEntry, now time.Time) bucket.State {
	reset := e.full.Sub(now)
	retry := e.next.Sub(now)
	if h.Cost > h.Limit.Burst {
		retry = reset
	} else if h.Cost > 1 {
		interval := h.Limit.Period / time.Duration(h.Limit.Requests)
		retry += time.Duration(h.Cost-1) * interval
	}
	return bucket.State{RetryAfter: retry, ResetAfter: max(reset, retry)}
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
		r.buf = l.appendKey(r.buf, d.hits[i].Key)
	}
	r.keys = string(r.buf)
	for i := range d.hits {
		if d.isLocal(i) {
			continue
		}
		h := &d.hits[i]
		key := r.keys[i*l.keyLen : (i+1)*l.keyLen]
		p, err := l.partFor(ctx, r, key, h.Key, bySlot)
		if err != nil {
			return err
		}
		p.add(key, h, i, flags(h))
	}
	return nil
}

// appendKey appends the Redis key of bucket k, "<prefix>:{<hex of k>}". The
// hash is the whole hash tag, so whatever a client sends, only the bucket's
// hash chooses the slot.
func (l *Limiter) appendKey(b []byte, k bucket.Key) []byte {
	const hexDigits = "0123456789abcdef"
	b = append(b, l.prefix...)
	b = append(b, ":{"...)
	for _, c := range k {
		b = append(b, hexDigits[c>>4], hexDigits[c&0xf])
	}
	return append(b, '}')
}

// partFor returns the part of r that takes key (of bucket k): the only one
// on a single Redis, the one of its master (or slot, when bySlot is set) in
// a cluster, of its bucket in a Ring.
func (l *Limiter) partFor(ctx context.Context, r *request, key string, k bucket.Key, bySlot bool) (*part, error) {
	t, s := l.one, 0
	if l.route == routeSlot {
		var err error
		if t, err = l.targetFor(ctx, key); err != nil {
			return nil, err
		}
		s = anySlot
		if bySlot {
			s = slot([]byte(key[len(l.prefix)+2 : len(key)-1])) // the hash tag
		}
	}
	if l.route != routeKey {
		k = bucket.Key{}
	}
	for _, p := range r.parts {
		if p.target == t && p.slot == s && p.bucket == k {
			return p, nil
		}
	}
	p := r.newPart()
	p.target, p.slot, p.bucket = t, s, k
	return p, nil
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
		q.target, q.slot, q.bucket = p.target, p.slot, p.bucket
		for j, i := range p.refs {
			h := &d.hits[i]
			if isTake(h) && h.Cost > 0 {
				q.add(p.keys[j], h, i, flagGive|flagIndependent)
			}
		}
	}
	if len(g.parts) == 0 || !wait {
		if n := int32(len(g.parts)); n > 0 {
			g.pending.Store(n)
			g.refs.Add(n)
			l.enqueue(g) // the writers recycle g
		}
		l.release(g)
		return nil
	}
	defer l.release(g)
	if err := l.do(context.WithoutCancel(ctx), g); err != nil {
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
			h := &d.hits[i]
			rep := &p.replies[j]
			switch {
			case h.Give:
				l.cache.drop(h.Key)
			case h.Independent || p.refunded:
			case rep.remaining == 0 && rep.next > 0:
				l.cache.put(h.Key, emptyEntry{next: start.Add(rep.next), full: start.Add(rep.reset)}, start)
			}
		}
	}
}
