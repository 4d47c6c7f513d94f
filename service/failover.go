package service

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-rls/sluice/descriptors"
)

// FailureMode says what the global layer does while Redis is failing
// (--redis-failure).
type FailureMode int

const (
	// FailShare enforces global rules in memory at this node's share:
	// rate/N and burst/N (at least one token), N the live node count.
	FailShare FailureMode = iota
	// FailLocal skips the global layer; the local layer still limits.
	FailLocal
	// FailAllow answers OK to every request.
	FailAllow
	// FailDeny refuses every request that has a global limit.
	FailDeny
)

// Probe backoff while in fallback: the first probe comes after
// probeMinBackoff, each failure doubles the wait up to probeMaxBackoff.
const (
	probeMinBackoff = 50 * time.Millisecond
	probeMaxBackoff = time.Second
)

// FailoverOptions configures a Failover.
type FailoverOptions struct {
	Primary  Limiter                         // the Redis global layer
	Fallback Limiter                         // memory buckets for FailShare
	Probe    func(ctx context.Context) error // answers nil when Primary is usable again
	Nodes    func() int                      // live node count N (< 1 counts as 1)
	Mode     FailureMode
	Classify func(error) string // error kind label: timeout, connection, script, oom, noperm, other
	// Abandoned reports that an error of Primary.Hit says its caller gave up
	// before the answer came (backend/redis: ErrAbandoned), rather than
	// Primary failing. Nil: any error after the caller's context ended is
	// taken as the caller's.
	Abandoned func(error) bool
	// StallAfter: a timed-out call switches the node only when no call has
	// succeeded for this long, or when timeouts have kept coming for this
	// long (no gap as long between two: a dead Redis Cluster master while
	// the others answer); until then it is answered by the failure mode
	// alone. One slow call (a large request, a busy CPU) is no stalled
	// Redis. 0 switches at the first timeout. Other errors always switch at
	// once.
	StallAfter time.Duration
	Logger     *slog.Logger
	Metrics    *FailoverMetrics // nil records nothing
	Now        func() time.Time // nil = time.Now
	// Tracer writes a span for each answer of the fallback (share and deny
	// modes) within a traced request. Nil: none.
	Tracer trace.Tracer
}

// Failover is the global layer with failing open. While Primary answers it
// is used; the first failed call — or timed-out call with no success for
// StallAfter — switches the node to fallback — that call and every later
// one are answered by the failure mode, and no request touches Primary —
// until a background probe, retried with backoff, finds Primary answering
// and switches back. A stalled Redis so costs each node the timeouts of at
// most StallAfter, not one per request.
//
// Only Primary's own failures count: a call that fails because its caller
// gave up (its deadline passed, or it cancelled) is returned as an error to
// that caller alone; it neither switches the node nor counts as a Redis
// error. Primary must therefore bound its calls with a deadline of its own
// (backend/redis: Options.Timeout), not only the caller's, and say which
// errors are its callers' (FailoverOptions.Abandoned), so that a Redis that
// fails while its callers give up still switches the node.
//
// Failover implements Limiter; the Server recognises it to report the
// layer (global or fallback) and to apply FailAllow.
type Failover struct {
	opts       FailoverOptions
	log        *slog.Logger
	inFallback atomic.Bool
	lastOK     atomic.Int64 // Unix nanoseconds of a recent success of Primary
	// The current run of timeouts, in Unix nanoseconds: its first and its
	// latest. Updated without a lock: a race only shifts a run's start.
	timeoutsFrom, lastTimeout atomic.Int64

	mu        sync.Mutex // guards probing, recovered and lastWait
	probing   bool
	recovered time.Time     // when the last probe switched back
	lastWait  time.Duration // the backoff that probe had reached
	closed    chan struct{} // closed by Close: stops the probe
	once      sync.Once
	scratch   sync.Pool // *[]descriptors.Hit for shared limits
}

// NewFailover returns a Failover in the Primary state.
func NewFailover(opts FailoverOptions) *Failover {
	f := &Failover{opts: opts, log: opts.Logger, closed: make(chan struct{})}
	if f.log == nil {
		f.log = slog.New(slog.DiscardHandler)
	}
	if f.opts.Now == nil {
		f.opts.Now = time.Now
	}
	if f.opts.Classify == nil {
		f.opts.Classify = func(error) string { return "other" }
	}
	f.scratch.New = func() any { return new([]descriptors.Hit) }
	opts.Metrics.setActive(false)
	return f
}

// Close stops the probe, if one runs. The Failover keeps answering.
func (f *Failover) Close() { f.once.Do(func() { close(f.closed) }) }

// InFallback reports whether the node is answering from its fallback.
func (f *Failover) InFallback() bool { return f.inFallback.Load() }

// Hit implements Limiter.
func (f *Failover) Hit(ctx context.Context, hits []descriptors.Hit, states []descriptors.BucketState) (bool, error) {
	ok, _, err := f.hit(ctx, hits, states)
	return ok, err
}

// allowAll reports whether every request is to be answered OK right now.
func (f *Failover) allowAll() bool { return f.opts.Mode == FailAllow && f.inFallback.Load() }

// hit decides hits on Primary or, in fallback, by the failure mode. The
// layer is layerGlobal or layerFallback; skipped means the global layer
// gave no answer (FailLocal) and states are not valid.
func (f *Failover) hit(ctx context.Context, hits []descriptors.Hit, states []descriptors.BucketState) (ok bool, layer int, err error) {
	if !f.inFallback.Load() {
		start := f.opts.Now()
		ok, err := f.opts.Primary.Hit(ctx, hits, states)
		if err != nil && f.abandoned(ctx, err) {
			// The caller's deadline passed or it cancelled: Redis is not to
			// blame. Neither a Redis error nor a reason to fall back.
			f.opts.Metrics.observe(f.opts.Now().Sub(start), nil, f.opts.Classify)
			return false, layerGlobal, err
		}
		end := f.opts.Now()
		f.opts.Metrics.observe(end.Sub(start), err, f.opts.Classify)
		if err == nil {
			f.noteSuccess(end)
			return ok, layerGlobal, nil
		}
		if !errors.Is(err, context.DeadlineExceeded) || f.stalled(end.UnixNano()) {
			f.enterFallback(err)
		}
	}
	return f.fallback(ctx, hits, states)
}

// stalled records a timeout at now (Unix nanoseconds) and reports whether
// Redis counts as stalled: no success for StallAfter, or timeouts without a
// gap of StallAfter for StallAfter.
func (f *Failover) stalled(now int64) bool {
	window := int64(f.opts.StallAfter)
	if now-f.lastTimeout.Swap(now) >= window {
		f.timeoutsFrom.Store(now) // a new run of timeouts
	}
	return now-f.lastOK.Load() >= window || now-f.timeoutsFrom.Load() >= window
}

// noteSuccess records a success of Primary at t. It writes the shared
// word at most once a millisecond, so concurrent callers do not contend
// for it on every request.
func (f *Failover) noteSuccess(t time.Time) {
	if n := t.UnixNano(); n-f.lastOK.Load() > int64(time.Millisecond) {
		f.lastOK.Store(n)
	}
}

// abandoned reports whether err, returned by Primary under ctx, is the
// caller's giving up rather than Primary failing: the caller's context has
// ended, and Primary (when it can tell) says so.
func (f *Failover) abandoned(ctx context.Context, err error) bool {
	return ctx.Err() != nil && (f.opts.Abandoned == nil || f.opts.Abandoned(err))
}

// errSkipped tells the Server that the global layer gave no answer.
var errSkipped = errors.New("global layer skipped in fallback (--redis-failure local)")

// fallback answers by the failure mode.
func (f *Failover) fallback(ctx context.Context, hits []descriptors.Hit, states []descriptors.BucketState) (ok bool, layer int, err error) {
	if f.opts.Mode == FailLocal || f.opts.Mode == FailAllow {
		return true, layerFallback, errSkipped
	}
	ctx, span := f.fallbackSpan(ctx)
	ok, err = f.answer(ctx, hits, states)
	endFallbackSpan(span, ok, err)
	return ok, layerFallback, err
}

// answer decides hits in the share or deny mode.
func (f *Failover) answer(ctx context.Context, hits []descriptors.Hit, states []descriptors.BucketState) (bool, error) {
	switch f.opts.Mode {
	case FailDeny:
		for i := range hits {
			states[i] = descriptors.BucketState{Allowed: hits[i].Give, RetryAfter: probeMaxBackoff, ResetAfter: probeMaxBackoff}
		}
		return false, nil
	}
	n := f.opts.Nodes()
	if n <= 1 {
		return f.opts.Fallback.Hit(ctx, hits, states)
	}
	bp := f.scratch.Get().(*[]descriptors.Hit)
	shared := append((*bp)[:0], hits...)
	for i := range shared {
		shared[i].Limit = share(shared[i].Limit, n)
	}
	ok, err := f.opts.Fallback.Hit(ctx, shared, states)
	*bp = shared
	f.scratch.Put(bp)
	return ok, err
}

// share is this node's part of a global limit among n nodes: the same
// tokens over an n times longer period (exactly rate/n), and burst/n, at
// least one token.
func share(l descriptors.Limit, n int) descriptors.Limit {
	l.Period *= time.Duration(n)
	if l.Requests > 0 {
		l.Burst = max(l.Burst/uint64(n), 1)
	}
	return l
}

// enterFallback switches to fallback after err and starts the probe.
func (f *Failover) enterFallback(err error) {
	if f.inFallback.Swap(true) {
		return
	}
	f.log.Warn("Redis failed: answering from the fallback until it recovers",
		"err", err, "mode", f.opts.Mode.String(), "nodes", f.opts.Nodes())
	f.opts.Metrics.transition(true)
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.probing {
		f.probing = true
		go f.probe()
	}
}

// probe checks Primary with backoff until it answers, then switches back.
// It is the only goroutine a Failover starts; it ends when Redis is back or
// at Close.
func (f *Failover) probe() {
	wait := f.firstWait()
	failures := 0
	for {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-f.closed:
			t.Stop()
			f.mu.Lock()
			f.probing = false
			f.mu.Unlock()
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), probeMaxBackoff)
		err := f.opts.Probe(ctx)
		cancel()
		if err == nil {
			break
		}
		// The first failure and every tenth after it at warn level, so a
		// lasting cause (wrong password, bad certificate) stays visible
		// without a line per probe.
		if failures%10 == 0 {
			f.log.Warn("Redis probe failed; still in fallback", "err", err, "failures", failures+1)
		}
		failures++
		wait = min(wait*2, probeMaxBackoff)
	}
	f.mu.Lock()
	f.probing = false
	f.recovered = f.opts.Now()
	f.noteSuccess(f.recovered)
	f.lastWait = wait
	f.inFallback.Store(false)
	f.mu.Unlock()
	f.log.Warn("Redis answers again: back on the global layer")
	f.opts.Metrics.transition(false)
}

// flapWindow: a failure this soon after recovering continues the previous
// backoff instead of probing from probeMinBackoff again, so a Redis that
// answers probes but fails real calls is not hammered.
const flapWindow = 10 * time.Second

// firstWait is the probe's first backoff.
func (f *Failover) firstWait() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.recovered.IsZero() && f.opts.Now().Sub(f.recovered) < flapWindow {
		return min(max(f.lastWait*2, probeMinBackoff), probeMaxBackoff)
	}
	return probeMinBackoff
}

// String returns the --redis-failure spelling of m.
func (m FailureMode) String() string {
	switch m {
	case FailLocal:
		return "local"
	case FailAllow:
		return "allow"
	case FailDeny:
		return "deny"
	}
	return "share"
}

// ParseFailureMode parses a --redis-failure value.
func ParseFailureMode(s string) (FailureMode, bool) {
	for _, m := range []FailureMode{FailShare, FailLocal, FailAllow, FailDeny} {
		if m.String() == s {
			return m, true
		}
	}
	return FailShare, false
}
