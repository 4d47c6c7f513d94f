package lease

import (
	"container/heap"
	"context"
	"fmt"

	"github.com/sluice-rls/sluice/backend/leaseproto"
)

// maxCallOps bounds the ops of one background call: a script call blocks
// Redis while it runs (backend/redis bounds its calls the same way).
const maxCallOps = 512

// Run gives back the leases whose period ended, every Options.Tick, and
// fetches the leases that ran low (at once, when signalled), until ctx is
// done or Close is called. Each round is one Lease call (per 512 keys)
// carrying every key's prefetch and give-back.
func (l *Limiter) Run(ctx context.Context) {
	l.runMu.Lock()
	defer l.runMu.Unlock()
	t := l.clock.NewTicker(l.opts.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.done:
			return
		case <-t.Chan():
			l.step(ctx, stepTick)
		case <-l.nudge:
			l.step(ctx, stepFetch)
		}
	}
}

// stepMode says what a step looks at besides the queued prefetches and
// give-backs.
type stepMode int

const (
	// stepFetch sends what is queued alone: a nudge, which comes with
	// every prefetch. Walking every pool there made the walk's cost grow
	// with keys × prefetches (13% of the server's CPU on the envoy load
	// mix, 10,000 client addresses leased).
	stepFetch stepMode = iota
	// stepTick gives back the pools whose period ended too, and forgets
	// idle keys once a period.
	stepTick
	// stepAll gives back every pool, and queues no prefetch (Close).
	stepAll
)

// start starts Run in a goroutine of its own (Options.Autostart), once,
// and never after Close.
func (l *Limiter) start() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.started.Load() {
		return
	}
	l.started.Store(true)
	l.runs.Go(func() { l.Run(context.Background()) })
}

// Close stops Run, then gives back every token the node holds, in one
// call (per 512 keys) under the Leaser's timeout. Later Hits still work
// but take no new leases. Calling it again does nothing more.
func (l *Limiter) Close(ctx context.Context) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.done)
	l.mu.Unlock()
	l.runs.Wait()
	l.runMu.Lock() // Run has returned
	defer l.runMu.Unlock()
	err := l.step(ctx, stepAll)
	l.batch.wait()
	return err
}

// renewSpent is how many of an ended pool's tokens a key must have spent
// for Run to lease its next pool in the call that gives the ended one back
// (renewing it). A key that spent fewer is likely idle: its next decision,
// if any, leases again (and waits on Redis), as a new key's would.
const renewSpent = 2

// prefetchOp is the leaseproto.Op of a prefetch of e's next lease: an
// independent take of nothing, always allowed, with its lease.
func (l *Limiter) prefetchOp(e *entry, decision uint64) leaseproto.Op {
	return leaseproto.Op{
		Key: e.key, Limit: e.limit, Decision: decision, Kind: leaseproto.Independent,
		Extra: l.maxLease(e.limit), Share: l.share(),
	}
}

// step sends the queued prefetches and give-backs, and as mode says the
// give-backs of ended pools, and forgets idle keys.
func (l *Limiter) step(ctx context.Context, mode stepMode) error {
	all := mode == stepAll
	var ops []leaseproto.Op
	l.mu.Lock()
	now := l.clock.Now()
	for k := range l.fetch {
		e := l.entries[k]
		if e == nil || all {
			if e != nil {
				e.fetching = false
			}
			continue
		}
		ops = append(ops, l.prefetchOp(e, uint64(len(ops)+1)))
	}
	clear(l.fetch)
	for _, op := range l.pending {
		op.Decision = uint64(len(ops) + 1)
		ops = append(ops, op)
	}
	l.pending = nil
	for mode != stepFetch && len(l.ends) > 0 && (all || !now.Before(l.ends[0].at)) {
		end := heap.Pop(&l.ends).(poolEnd)
		e := l.entries[end.key]
		if e == nil || e.granted == 0 || !e.expires.Equal(end.at) {
			continue // closed before its end
		}
		// The pool's end (spent or not, Redis counts its tokens as parked
		// until it is closed).
		renew := !all && !e.fetching && e.pooled > e.held && e.pooled-e.held >= renewSpent
		if op, ok := l.closePool(e, uint64(len(ops)+1)); ok {
			ops = append(ops, op)
		}
		if renew {
			// A key in use: the next pool in the same call, so that its
			// next decision need not wait on Redis.
			e.fetching = true
			ops = append(ops, l.prefetchOp(e, uint64(len(ops)+1)))
		}
	}
	// Idle keys (no pool, unused for a lease period) are forgotten once a
	// period: a sweep walks every key, so it is not done per tick.
	if mode != stepFetch && now.Sub(l.swept) >= l.opts.Period {
		l.swept = now
		for k, e := range l.entries {
			if e.granted == 0 && !e.fetching && now.Sub(e.used) > l.opts.Period {
				delete(l.entries, k)
			}
		}
	}
	l.mu.Unlock()
	var first error
	for len(ops) > 0 {
		n := min(len(ops), maxCallOps)
		if err := l.background(ctx, ops[:n]); err != nil && first == nil {
			first = err
		}
		ops = ops[n:]
	}
	return first
}

// background runs one call of step and records its replies. A failed
// give-back loses its tokens (they left Redis, so losing them never
// admits more; keeping them past their pool's end would spend tokens that
// Redis may no longer count as parked).
func (l *Limiter) background(ctx context.Context, ops []leaseproto.Op) error {
	replies := make([]leaseproto.Reply, len(ops))
	send := l.clock.Now()
	err := windowed{l.opts.Leaser, 2 * l.opts.Period}.Lease(ctx, ops, replies)
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	for j, op := range ops {
		e := l.entries[op.Key]
		if op.Kind == leaseproto.Independent && e != nil {
			e.fetching = false
		}
		if err != nil || e == nil || e.limit != op.Limit {
			continue
		}
		r := &replies[j]
		e.fullLo, e.fullHi = send.Add(r.Reset), now.Add(r.Reset)
		if r.Leased > 0 {
			l.grant(e, r, send, now)
		}
	}
	if err != nil {
		return fmt.Errorf("backend/lease: background lease call: %w", err)
	}
	return nil
}
