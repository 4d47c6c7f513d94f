package fallback

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-rls/sluice/bucket"
)

// Options configures a Limiter.
type Options struct {
	Primary bucket.Limiter                  // the cluster-wide layer (backend/redis)
	Share   bucket.Limiter                  // memory buckets for the Share mode
	Probe   func(ctx context.Context) error // nil when Primary is usable again
	Nodes   func() int                      // live node count N (< 1 counts as 1)
	Mode    Mode
	// Classify names the kind of a Primary error, the kind label of
	// ratelimit_redis_errors_total (backend/redis.ErrorKind). Nil: "other".
	Classify func(error) string
	// Abandoned reports that an error of Primary.Hit says its caller gave up
	// before the answer came (backend/redis: ErrAbandoned), rather than
	// Primary failing. Nil: any error after the caller's context ended is
	// taken as the caller's.
	Abandoned func(error) bool
	// StallAfter: a timed-out call makes the node suspect a stalled Redis
	// only when no call has succeeded for this long, or when timeouts have
	// kept coming for this long (no gap as long between two: a dead Redis
	// Cluster master while the others answer); until then it is answered
	// by the failure mode alone. One slow call (a large request, a busy
	// CPU) is no stalled Redis. 0 suspects at the first timeout. Other
	// errors always switch at once.
	StallAfter time.Duration
	// Confirm is the deadline of the probe that confirms a suspected stall
	// before the node switches: the switch comes only when that probe
	// fails; when it answers, the node stays on Redis and the timeouts so
	// far are forgotten. Meanwhile calls still go to Primary and timed-out
	// ones are answered by the failure mode alone. On a starved CPU calls
	// miss a short deadline in bursts while Redis is fine: a probe with a
	// generous deadline tells the two apart. 0 switches without
	// confirming.
	Confirm time.Duration
	Logger  *slog.Logger
	Metrics *Metrics        // nil records nothing
	Clock   clockwork.Clock // times calls and drives the probe; nil = the real clock
	// Tracer writes a span for each answer of the fallback (share and deny
	// modes) within a traced request. Nil: none.
	Tracer trace.Tracer
}

// Limiter is the global layer with failing open. While Primary answers it
// is used; the first failed call — or, for timeouts, a stall (timeouts
// with no success for StallAfter) that a probe with the Confirm deadline
// confirms — switches the node to fallback: that call and every later one
// are answered by the failure mode, and no request touches Primary, until
// a background probe, retried with backoff, finds Primary answering and
// switches back. A stalled Redis so costs each node the timeouts of at
// most StallAfter + Confirm, not one per request; a starved CPU that makes
// calls miss their deadline for a moment costs the timed-out requests an
// answer from the failure mode, and no switch.
//
// Only Primary's own failures count: a call that fails because its caller
// gave up (its deadline passed, or it cancelled) is returned as an error to
// that caller alone; it neither switches the node nor counts as a Redis
// error. Primary must therefore bound its calls with a deadline of its own
// (backend/redis: Options.Timeout), not only the caller's, and say which
// errors are its callers' (Options.Abandoned), so that a Redis that fails
// while its callers give up still switches the node.
//
// Its Decisions say who answered: Decided (Primary), Fallback (the Share
// or Deny mode), Skipped (Local) or Bypassed (Allow). It is safe for
// concurrent use.
type Limiter struct {
	opts       Options
	log        *slog.Logger
	clock      clockwork.Clock
	inFallback atomic.Bool
	lastOK     atomic.Int64 // Unix nanoseconds of a recent success of Primary
	// The current run of timeouts, in Unix nanoseconds: its first and its
	// latest. Updated without a lock: a race only shifts a run's start.
	timeoutsFrom, lastTimeout atomic.Int64
	confirming                atomic.Bool // a confirming probe runs

	// stop ends the probes' calls at Close.
	stop       context.Context
	cancelStop context.CancelFunc
	mu         sync.Mutex // guards probing, recovered and lastWait
	probing    bool
	recovered  time.Time     // when the last probe switched back
	lastWait   time.Duration // the backoff that probe had reached
	closed     chan struct{} // closed by Close: stops the probe
	once       sync.Once
	probeDone  sync.WaitGroup // the probe goroutine, for Close
	scratch    sync.Pool      // *[]bucket.Hit for shared limits
	states     sync.Pool      // *[]bucket.State for track
}

// New returns a Limiter in the Primary state.
func New(opts Options) *Limiter {
	l := &Limiter{opts: opts, log: opts.Logger, clock: opts.Clock, closed: make(chan struct{})}
	l.stop, l.cancelStop = context.WithCancel(context.Background())
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	if l.clock == nil {
		l.clock = clockwork.NewRealClock()
	}
	if l.opts.Classify == nil {
		l.opts.Classify = func(error) string { return "other" }
	}
	l.scratch.New = func() any { return new([]bucket.Hit) }
	l.states.New = func() any { return new([]bucket.State) }
	opts.Metrics.setActive(false)
	return l
}

// Close stops the probe, if one runs, and waits for it to end. The Limiter
// keeps answering.
func (l *Limiter) Close() {
	l.once.Do(func() {
		close(l.closed)
		l.cancelStop()
	})
	l.mu.Lock() // a probe starts under mu only while closed is open
	l.mu.Unlock()
	l.probeDone.Wait()
}

// Active reports whether the node is answering from its fallback.
func (l *Limiter) Active() bool { return l.inFallback.Load() }

// State describes who answers global rules: "redis", or "fallback (<mode>)"
// while the primary is failing (the /healthcheck body).
func (l *Limiter) State() string {
	if l.Active() {
		return "fallback (" + l.opts.Mode.String() + ")"
	}
	return "redis"
}

// Shared reports whether Primary's buckets are shared: the keys sent to it
// must be. The Share fallback keys them alike, which costs it nothing.
func (l *Limiter) Shared() bool { return l.opts.Primary.Shared() }

// Hit implements bucket.Limiter: it decides hits on Primary or, in
// fallback, by the failure mode.
func (l *Limiter) Hit(ctx context.Context, hits []bucket.Hit, states []bucket.State) (bucket.Decision, error) {
	if !l.inFallback.Load() {
		start := l.clock.Now()
		d, err := l.opts.Primary.Hit(ctx, hits, states)
		if err != nil && l.abandoned(ctx, err) {
			// The caller's deadline passed or it cancelled: Redis is not to
			// blame. Neither a Redis error nor a reason to fall back.
			l.opts.Metrics.observe(l.clock.Since(start), nil, l.opts.Classify)
			return bucket.Decision{}, err
		}
		end := l.clock.Now()
		l.opts.Metrics.observe(end.Sub(start), err, l.opts.Classify)
		if err == nil {
			l.noteSuccess(end)
			if l.opts.Mode == Share {
				l.track(ctx, hits)
			}
			return d, nil
		}
		switch {
		case !errors.Is(err, context.DeadlineExceeded):
			l.enterFallback(err)
		case l.stalled(end.UnixNano()):
			l.suspect(err)
		}
	}
	return l.fallback(ctx, hits, states)
}

// stalled records a timeout at now (Unix nanoseconds) and reports whether
// Redis counts as stalled: no success for StallAfter, or timeouts without a
// gap of StallAfter for StallAfter.
func (l *Limiter) stalled(now int64) bool {
	window := int64(l.opts.StallAfter)
	if now-l.lastTimeout.Swap(now) >= window {
		l.timeoutsFrom.Store(now) // a new run of timeouts
	}
	return now-l.lastOK.Load() >= window || now-l.timeoutsFrom.Load() >= window
}

// noteSuccess records a success of Primary at t. It writes the shared
// word at most once a millisecond, so concurrent callers do not contend
// for it on every request.
func (l *Limiter) noteSuccess(t time.Time) {
	if n := t.UnixNano(); n-l.lastOK.Load() > int64(time.Millisecond) {
		l.lastOK.Store(n)
	}
}

// abandoned reports whether err, returned by Primary under ctx, is the
// caller's giving up rather than Primary failing: the caller's context has
// ended, and Primary (when it can tell) says so.
func (l *Limiter) abandoned(ctx context.Context, err error) bool {
	return ctx.Err() != nil && (l.opts.Abandoned == nil || l.opts.Abandoned(err))
}

// fallback answers by the failure mode.
func (l *Limiter) fallback(ctx context.Context, hits []bucket.Hit, states []bucket.State) (bucket.Decision, error) {
	switch l.opts.Mode {
	case Local:
		return bucket.Decision{Allowed: true, Answer: bucket.Skipped}, nil
	case Allow:
		return bucket.Decision{Allowed: true, Answer: bucket.Bypassed}, nil
	}
	ctx, span := l.startSpan(ctx)
	ok, err := l.answer(ctx, hits, states)
	endSpan(span, ok, err)
	return bucket.Decision{Allowed: ok, Answer: bucket.Fallback}, err
}

// answer decides hits in the Share or Deny mode.
func (l *Limiter) answer(ctx context.Context, hits []bucket.Hit, states []bucket.State) (bool, error) {
	if l.opts.Mode == Deny {
		for i := range hits {
			states[i] = bucket.State{Allowed: hits[i].Give, RetryAfter: probeMaxBackoff, ResetAfter: probeMaxBackoff}
		}
		return false, nil
	}
	n := l.opts.Nodes()
	if n <= 1 {
		d, err := l.opts.Share.Hit(ctx, hits, states)
		return d.Allowed, err
	}
	bp := l.scratch.Get().(*[]bucket.Hit)
	shared := append((*bp)[:0], hits...)
	for i := range shared {
		shared[i].Limit = share(shared[i].Limit, n)
	}
	d, err := l.opts.Share.Hit(ctx, shared, states)
	*bp = shared
	l.scratch.Put(bp)
	return d.Allowed, err
}

// share is this node's part of a global limit among n nodes: the same
// tokens over an n times longer period (exactly rate/n), and burst/n, at
// least one token.
func share(lim bucket.Limit, n int) bucket.Limit {
	lim.Period *= time.Duration(n)
	if lim.Requests > 0 {
		lim.Burst = max(lim.Burst/uint64(n), 1)
	}
	return lim
}

// GuardLocal returns the local layer as the server should use it: local
// itself, except in the Allow mode, where while the node is in fallback
// every call is Bypassed, so that the whole request is answered OK, the
// local layer included (--redis-failure allow).
func (l *Limiter) GuardLocal(local bucket.Limiter) bucket.Limiter {
	if l.opts.Mode != Allow {
		return local
	}
	return guarded{sw: l, local: local}
}

// guarded is a local layer that the Allow mode bypasses while in fallback.
type guarded struct {
	sw    *Limiter
	local bucket.Limiter
}

// Hit implements bucket.Limiter.
func (g guarded) Hit(ctx context.Context, hits []bucket.Hit, states []bucket.State) (bucket.Decision, error) {
	if g.sw.Active() {
		return bucket.Decision{Allowed: true, Answer: bucket.Bypassed}, nil
	}
	return g.local.Hit(ctx, hits, states)
}

// Shared implements bucket.Limiter.
func (g guarded) Shared() bool { return g.local.Shared() }
