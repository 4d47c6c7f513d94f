package fallback

import (
	"context"
	"time"
)

// Probe backoff while in fallback: the first probe comes after
// probeMinBackoff, each failure doubles the wait up to probeMaxBackoff.
const (
	probeMinBackoff = 50 * time.Millisecond
	probeMaxBackoff = time.Second
)

// flapWindow: a failure this soon after recovering continues the previous
// backoff instead of probing from probeMinBackoff again, so a Redis that
// answers probes but fails real calls is not hammered.
const flapWindow = 10 * time.Second

// enterFallback switches to fallback after err and starts the probe.
func (l *Limiter) enterFallback(err error) {
	if l.inFallback.Swap(true) {
		return
	}
	l.log.Warn("Redis failed: answering from the fallback until it recovers",
		"err", err, "mode", l.opts.Mode.String(), "nodes", l.opts.Nodes())
	l.opts.Metrics.transition(true)
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.closed: // Close has run: no goroutine may start
		return
	default:
	}
	if !l.probing {
		l.probing = true
		l.probeDone.Add(1)
		go l.probe()
	}
}

// probe checks Primary with backoff until it answers, then switches back.
// It is the only goroutine a Limiter starts; it ends when Redis is back or
// at Close.
func (l *Limiter) probe() {
	defer l.probeDone.Done()
	wait := l.firstWait()
	failures := 0
	for {
		t := l.clock.NewTimer(wait)
		select {
		case <-t.Chan():
		case <-l.closed:
			t.Stop()
			l.mu.Lock()
			l.probing = false
			l.mu.Unlock()
			return
		}
		ctx, cancel := context.WithTimeout(l.stop, probeMaxBackoff)
		err := l.opts.Probe(ctx)
		cancel()
		if err == nil {
			break
		}
		// The first failure and every tenth after it at warn level, so a
		// lasting cause (wrong password, bad certificate) stays visible
		// without a line per probe.
		if failures%10 == 0 {
			l.log.Warn("Redis probe failed; still in fallback", "err", err, "failures", failures+1)
		}
		failures++
		wait = min(wait*2, probeMaxBackoff)
	}
	l.mu.Lock()
	l.probing = false
	l.recovered = l.clock.Now()
	l.noteSuccess(l.recovered)
	l.lastWait = wait
	l.inFallback.Store(false)
	l.mu.Unlock()
	l.log.Warn("Redis answers again: back on the global layer")
	l.opts.Metrics.transition(false)
}

// firstWait is the probe's first backoff.
func (l *Limiter) firstWait() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.recovered.IsZero() && l.clock.Since(l.recovered) < flapWindow {
		return min(max(l.lastWait*2, probeMinBackoff), probeMaxBackoff)
	}
	return probeMinBackoff
}
