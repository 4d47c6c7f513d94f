package redis

import (
	"context"
	"maps"
	"sync"

	goredis "github.com/redis/go-redis/v9"
)

// DefaultWriters is Options.Writers when it is 0. One call in flight per
// server makes the largest batches: against 2, under the envoy mix at c=64
// (two runs each) server CPU 20.5 -> 19.7 µs and Redis CPU 12.1 -> 11.5 µs
// per request, round trips 0.085 -> 0.05, p99 unchanged.
const DefaultWriters = 1

// maxCallKeys bounds the keys of the script calls one writer sends at once
// (a single decision with more goes alone): a script call blocks Redis while
// it runs, and a batch keeps every caller in it waiting for the whole reply.
const maxCallKeys = 512

// target is the queue of one Redis server (a Redis Cluster master, or the
// one server; every shard of a Ring): requests' parts wait in it for a
// writer.
//
// Batching without waiting: at most Limiter.writers script calls (or
// pipelines) to the server are in flight at once. A caller that finds a
// free slot and nobody queued sends its own call at once, in its own
// goroutine (inline). Otherwise it queues, and a writer takes everything
// queued (up to maxCallKeys keys) into one script call (one per slot after
// a stale cluster slot map): the requests that arrive while calls are in
// flight share the next one. A writer is a goroutine started when work is
// queued and a slot is free; it exits when it finds the queue empty, so an
// idle Limiter runs none.
type target struct {
	l      *Limiter
	mu     sync.Mutex
	queue  []*part
	queued int // keys in queue
	busy   int // calls in flight: writers and inline callers
}

// tryInline reserves a slot for a caller's own call if one is free and
// nobody is queued (who would otherwise be overtaken).
func (t *target) tryInline() bool {
	t.mu.Lock()
	ok := t.busy < t.l.writers && len(t.queue) == 0 && !t.l.closed.Load()
	if ok {
		t.busy++
		t.l.inFlight.Add(1)
	}
	t.mu.Unlock()
	return ok
}

// doneInline frees the slot of an inline call; parts queued meanwhile get
// a writer.
func (t *target) doneInline() {
	defer t.l.inFlight.Done()
	t.mu.Lock()
	t.busy--
	spawn := t.spawnLocked()
	t.mu.Unlock()
	if spawn {
		go t.write()
	}
}

// enqueue queues the parts of parts that go to t, for the next script
// call, starting a writer if a slot is free. After Close, it fails them.
func (t *target) enqueue(parts []*part) {
	t.mu.Lock()
	if t.l.closed.Load() {
		t.mu.Unlock()
		for _, p := range parts {
			if p.target == t {
				t.l.answer(p, errClosed)
			}
		}
		return
	}
	for _, p := range parts {
		if p.target == t {
			t.queue = append(t.queue, p)
			t.queued += len(p.keys)
		}
	}
	spawn := t.spawnLocked()
	t.mu.Unlock()
	if spawn {
		go t.write()
	}
}

// spawnLocked reserves a slot for a new writer when parts are queued, a
// slot is free and the Limiter is open. The caller starts it.
func (t *target) spawnLocked() bool {
	if len(t.queue) == 0 || t.busy >= t.l.writers || t.l.closed.Load() {
		return false
	}
	t.busy++
	t.l.inFlight.Add(1)
	return true
}

// write is a writer: it sends what is queued until the queue is empty.
func (t *target) write() {
	defer t.l.inFlight.Done()
	s := t.l.senders.Get().(*sender)
	defer t.l.senders.Put(s)
	for {
		t.mu.Lock()
		s.take(t)
		if len(s.batch) == 0 {
			t.busy--
			t.mu.Unlock()
			return
		}
		t.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), t.l.timeout)
		t.l.send(ctx, s, s.batch)
		cancel()
		clear(s.batch) // no stale pointers to pooled requests
	}
}

// take moves the parts of the next batch from t's queue into s.batch: all
// of them, or as many as fit in maxCallKeys keys (at least one). t.mu is
// held.
func (s *sender) take(t *target) {
	if t.queued <= maxCallKeys {
		s.batch, t.queue = t.queue, s.batch[:0]
		t.queued = 0
		return
	}
	s.batch = s.batch[:0]
	keys, n := 0, 0
	for _, p := range t.queue {
		if n > 0 && keys+len(p.keys) > maxCallKeys {
			break
		}
		keys += len(p.keys)
		n++
	}
	s.batch = append(s.batch, t.queue[:n]...)
	rest := copy(t.queue, t.queue[n:])
	clear(t.queue[rest:])
	t.queue = t.queue[:rest]
	t.queued -= keys
}

// drain empties the queue after Close, failing what waited in it.
func (t *target) drain() {
	t.mu.Lock()
	q := t.queue
	t.queue, t.queued = nil, 0
	t.mu.Unlock()
	for _, p := range q {
		t.l.answer(p, errClosed)
	}
}

// do sends the parts of r and waits for their answers, at most the Timeout
// or until ctx is done. It returns the first part's error.
func (l *Limiter) do(ctx context.Context, r *request) error {
	n := int32(len(r.parts))
	r.pending.Store(n)
	r.refs.Add(n)
	if n == 1 && r.parts[0].target.tryInline() {
		l.inline(ctx, r.parts[0])
		<-r.done
	} else {
		l.enqueue(r)
		if err := l.wait(ctx, r); err != nil {
			r.abandoned.Store(true)
			return err
		}
	}
	for _, p := range r.parts {
		if p.err != nil {
			return p.err
		}
	}
	return nil
}

// inline sends p, alone, from the caller's goroutine, under the Timeout
// only, as a writer would: the caller's deadline or cancellation does not
// cut the call short (that would fail it as if Redis had, close its
// connection and leave the decision unknown). The values of ctx go with
// the call.
func (l *Limiter) inline(ctx context.Context, p *part) {
	s := l.senders.Get().(*sender)
	r := p.req // the caller holds it until after this call
	r.values.Context = ctx
	ctx, cancel := context.WithTimeout(&r.values, l.timeout)
	s.batch = append(s.batch[:0], p)
	l.send(ctx, s, s.batch)
	cancel()
	r.values.Context = nil
	clear(s.batch)
	l.senders.Put(s)
	p.target.doneInline()
}

// enqueue queues every part of r, those for one server together (so that
// they go in one pipeline); after Close, they fail at once.
func (l *Limiter) enqueue(r *request) {
	for i, p := range r.parts {
		first := true
		for _, q := range r.parts[:i] {
			first = first && q.target != p.target
		}
		if first {
			p.target.enqueue(r.parts[i:])
		}
	}
}

// targetFor returns the queue of the cluster master that holds key.
func (l *Limiter) targetFor(ctx context.Context, key string) (*target, error) {
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
	return l.master(m.Options().Addr), nil
}

// master returns the queue of the master at addr, adding it if new.
func (l *Limiter) master(addr string) *target {
	if m := l.masters.Load(); m != nil {
		if t, ok := (*m)[addr]; ok {
			return t
		}
	}
	l.mastersMu.Lock()
	defer l.mastersMu.Unlock()
	old := l.masters.Load()
	if old != nil {
		if t, ok := (*old)[addr]; ok {
			return t
		}
	}
	m := make(map[string]*target)
	if old != nil {
		maps.Copy(m, *old)
	}
	t := &target{l: l}
	m[addr] = t
	l.masters.Store(&m)
	return t
}
