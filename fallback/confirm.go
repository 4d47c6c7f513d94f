package fallback

import (
	"context"
	"errors"
	"fmt"

	"github.com/jonboulle/clockwork"
)

// suspect handles a timeout that the stall rule counts as a stall (err):
// without Options.Confirm it switches the node at once; with it, it starts
// a probe with that deadline, unless one runs already, and only that
// probe's failure switches the node.
func (l *Limiter) suspect(err error) {
	if l.opts.Confirm <= 0 {
		l.enterFallback(err)
		return
	}
	if !l.confirming.CompareAndSwap(false, true) {
		return // a probe is already confirming
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.closed: // Close has run: no goroutine may start
		l.confirming.Store(false)
		return
	default:
	}
	l.probeDone.Add(1)
	go l.confirm(err, l.clock.Now().UnixNano())
}

// confirm probes Primary with the Confirm deadline after the timeout err,
// suspected at since (Unix nanoseconds). A probe that fails — with an
// error, or by timing out while no call has succeeded since — switches the
// node to fallback. A probe that answers, or times out while calls
// succeed (a starved CPU, not a stalled Redis), leaves the node on Primary
// with the run of timeouts forgotten, so that the next suspicion needs
// StallAfter of timeouts again.
func (l *Limiter) confirm(err error, since int64) {
	defer l.probeDone.Done()
	defer l.confirming.Store(false)
	ctx, cancel := clockwork.WithTimeout(l.stop, l.clock, l.opts.Confirm)
	perr := l.opts.Probe(ctx)
	cancel()
	select {
	case <-l.closed:
		return
	default:
	}
	if perr != nil && (!errors.Is(perr, context.DeadlineExceeded) || l.lastOK.Load() < since) {
		l.opts.Metrics.confirmed(true)
		// Counted as a Redis error of its kind: the probe may be the only
		// call that met what switched the node (an OOM that came while it
		// ran).
		l.opts.Metrics.observeError(perr, l.opts.Classify)
		l.enterFallback(fmt.Errorf("%w; confirmed by a probe: %w", err, perr))
		return
	}
	l.opts.Metrics.confirmed(false)
	now := l.clock.Now().UnixNano()
	l.lastOK.Store(now)
	l.timeoutsFrom.Store(now)
	if perr != nil {
		l.log.Info("Redis calls timed out, and so did a probe, but other calls succeeded: staying on Redis",
			"err", err, "probe_err", perr, "probe_deadline", l.opts.Confirm)
		return
	}
	l.log.Info("Redis calls timed out, but a probe answered: staying on Redis",
		"err", err, "probe_deadline", l.opts.Confirm)
}
