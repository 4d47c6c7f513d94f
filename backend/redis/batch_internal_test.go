package redis

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/internal/redistest"
)

// fakeSend is a sendFunc that answers every part without error, holding the
// first sends until the test releases them, one value of release per send:
// it makes "Writers sends in flight" a state a test sets up, without timing
// and without Redis.
type fakeSend struct {
	hold    atomic.Int32  // sends still to hold
	entered chan int      // the key count of every send, as it starts
	release chan struct{} // lets one held send go on
}

func (f *fakeSend) send(_ context.Context, parts []*part) {
	keys := 0
	for _, p := range parts {
		keys += len(p.keys)
	}
	f.entered <- keys
	if f.hold.Add(-1) >= 0 {
		<-f.release
	}
	for _, p := range parts {
		p.answer(nil)
	}
}

// next returns the key count of the next send to start.
func (f *fakeSend) next(t *testing.T) int {
	t.Helper()
	select {
	case n := <-f.entered:
		return n
	case <-time.After(10 * time.Second):
		t.Fatalf("no send within 10s")
		return 0
	}
}

// fakeBatcher returns a batcher of writers sends in flight per server,
// sending through a fakeSend that holds the first hold sends, and a
// source of requests for it.
func fakeBatcher(t *testing.T, writers int, timeout time.Duration, hold int32) (*batcher, *fakeSend, func(keys int) *request) {
	f := &fakeSend{entered: make(chan int, 100), release: make(chan struct{})}
	f.hold.Store(hold)
	b := newBatcher(f.send, writers, timeout)
	t.Cleanup(func() {
		close(f.release) // sends a failed test still holds go on
		b.close()
	})
	pool := new(sync.Pool)
	pool.New = func() any { return newRequest(pool) }
	// req returns a request with one part of keys keys, as a Limiter hands
	// it to the batcher; the caller holds a reference.
	req := func(keys int) *request {
		r := pool.Get().(*request)
		r.reset()
		r.refs.Store(1)
		p := r.newPart()
		p.queue = b.one
		for range keys {
			p.add("k", &bucket.Hit{Limit: bucket.Limit{Requests: 1, Period: time.Hour, Burst: 1}, Cost: 1}, 0, 0)
		}
		return r
	}
	return b, f, req
}

// doAsync runs b.do of r in a new goroutine.
func doAsync(b *batcher, r *request) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- b.do(context.Background(), r) }()
	return ch
}

// TestBatchSharesCall: with Writers sends in flight, new requests queue, and
// the first slot to free sends them all at once.
func TestBatchSharesCall(t *testing.T) {
	t.Parallel()
	b, f, req := fakeBatcher(t, 2, 10*time.Second, 2)
	a := doAsync(b, req(1))
	if n := f.next(t); n != 1 {
		t.Fatalf("first send: %d keys, want 1 (sent alone, at once)", n)
	}
	c := doAsync(b, req(1))
	if n := f.next(t); n != 1 {
		t.Fatalf("second send, one in flight: %d keys, want 1 (sent alone, at once)", n)
	}
	queued := []*request{req(1), req(1), req(1)}
	for _, r := range queued {
		b.post(r) // both slots busy: it queues
	}
	f.release <- struct{}{}
	if n := f.next(t); n != 3 {
		t.Errorf("send after a slot freed: %d keys, want 3 (the three queued requests)", n)
	}
	f.release <- struct{}{}
	for i, ch := range []<-chan error{a, c} {
		if err := <-ch; err != nil {
			t.Errorf("request %d sent at once: %v", i, err)
		}
	}
	for i, r := range queued {
		<-r.done
		if err := r.parts[0].err; err != nil {
			t.Errorf("queued request %d: %v", i, err)
		}
	}
	b.close() // every writer has exited
	if len(f.entered) != 0 {
		t.Errorf("%d more sends, want none", len(f.entered))
	}
}

// TestBatchMaxCallKeys: a writer sends at most maxCallKeys keys at once,
// whole requests each, and sends the rest next.
func TestBatchMaxCallKeys(t *testing.T) {
	t.Parallel()
	b, f, req := fakeBatcher(t, 1, 10*time.Second, 1)
	a := doAsync(b, req(1))
	f.next(t)
	queued := []*request{req(200), req(200), req(200)}
	for _, r := range queued {
		b.post(r)
	}
	f.release <- struct{}{}
	<-a
	if n := f.next(t); n != 400 {
		t.Errorf("first send of 3 × 200 queued keys: %d keys, want 400 (what fits in %d)", n, maxCallKeys)
	}
	if n := f.next(t); n != 200 {
		t.Errorf("second send: %d keys, want the last 200", n)
	}
	for _, r := range queued {
		<-r.done
	}
}

// TestQueuedDeadline: a queued request whose send cannot go out gives up at
// its own deadline, with a timeout, and is then never sent.
func TestQueuedDeadline(t *testing.T) {
	t.Parallel()
	const timeout = 100 * time.Millisecond
	b, f, req := fakeBatcher(t, 1, timeout, 1)
	a := doAsync(b, req(1))
	f.next(t)
	start := time.Now()
	err := b.do(context.Background(), req(1)) // queued behind a
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) || ErrorKind(err) != KindTimeout {
		t.Errorf("queued request: %v (kind %q), want kind timeout", err, ErrorKind(err))
	}
	if took < timeout || took > timeout+time.Second {
		t.Errorf("queued request gave up after %v, want ≈ %v", took, timeout)
	}
	f.release <- struct{}{}
	<-a
	b.close() // the writer that found the abandoned request has exited
	if len(f.entered) != 0 {
		t.Errorf("the abandoned request was sent (%d more sends), want none", len(f.entered))
	}
}

// TestCloseFailsQueued: close fails queued requests at once, waits for the
// send in flight, and later requests fail.
func TestCloseFailsQueued(t *testing.T) {
	t.Parallel()
	b, f, req := fakeBatcher(t, 1, 10*time.Second, 1)
	a := doAsync(b, req(1))
	f.next(t)
	q := req(1)
	b.post(q)
	closed := make(chan struct{})
	go func() { b.close(); close(closed) }()
	<-q.done
	if err := q.parts[0].err; ErrorKind(err) != KindConnection || !errors.Is(err, ErrConnection) {
		t.Errorf("request queued at close: %v (kind %q), want kind connection", err, ErrorKind(err))
	}
	select {
	case <-closed:
		t.Errorf("close returned with a send in flight")
	default:
	}
	f.release <- struct{}{}
	if err := <-a; err != nil {
		t.Errorf("send in flight at close: %v, want it answered", err)
	}
	<-closed
	if err := b.do(context.Background(), req(1)); ErrorKind(err) != KindConnection {
		t.Errorf("request after close: %v, want kind connection", err)
	}
}

// gate is a go-redis hook that holds the first script calls until the test
// releases them, one value of release per call.
type gate struct {
	hold    atomic.Int32  // calls still to hold
	entered chan struct{} // a value as every script call starts
	release chan struct{} // lets one held call go on
}

func (*gate) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (g *gate) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			g.entered <- struct{}{}
			if g.hold.Add(-1) >= 0 {
				<-g.release
			}
		}
		return next(ctx, cmd)
	}
}

func (*gate) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// take1 is a take of one token from bucket n.
func take1(n byte) bucket.Hit {
	return bucket.Hit{Key: bucket.Key{n}, Limit: bucket.Limit{Requests: 1, Period: time.Hour, Burst: 10}, Cost: 1}
}

// queueHit splits a take from bucket n into parts as Hit does and queues
// them without waiting; the request's done tells when they are answered.
func queueHit(t *testing.T, l *Limiter, n byte) *request {
	t.Helper()
	r := l.requests.Get().(*request)
	r.reset()
	r.refs.Store(1)
	r.dec.hits, r.dec.states = []bucket.Hit{take1(n)}, make([]bucket.State, 1)
	if err := l.split(context.Background(), r, false); err != nil {
		t.Fatalf("split: %v", err)
	}
	l.batch.post(r)
	return r
}

// TestKilledFailsQueued: when Redis dies, the call in flight and every
// request queued behind it fail at once with a connection error, long
// before the Timeout.
func TestKilledFailsQueued(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	const timeout = 5 * time.Second
	o, err := ParseURL("redis://"+s.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := goredis.NewUniversalClient(o)
	t.Cleanup(func() { _ = c.Close() })
	g := &gate{entered: make(chan struct{}, 100), release: make(chan struct{})}
	c.AddHook(g)
	l := New(Options{Client: c, Prefix: t.Name(), CacheSize: -1, Writers: 1, Timeout: timeout})
	t.Cleanup(l.Close)
	if _, err := l.Hit(context.Background(), []bucket.Hit{take1(255)}, make([]bucket.State, 1)); err != nil {
		t.Fatalf("warm-up (the script loaded, a connection in the pool): %v", err)
	}
	for len(g.entered) > 0 {
		<-g.entered
	}
	g.hold.Store(1)
	inFlight := make(chan error, 1)
	go func() {
		_, err := l.Hit(context.Background(), []bucket.Hit{take1(0)}, make([]bucket.State, 1))
		inFlight <- err
	}()
	select {
	case <-g.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no script call within 10s")
	}
	var queued []*request
	for i := range 20 {
		queued = append(queued, queueHit(t, l, byte(1+i))) // the one slot busy: it queues
	}
	s.Kill()
	start := time.Now()
	g.release <- struct{}{}
	if err := <-inFlight; ErrorKind(err) != KindConnection || !errors.Is(err, ErrConnection) {
		t.Errorf("request in flight on a killed Redis: %v (kind %q), want kind connection", err, ErrorKind(err))
	}
	for i, r := range queued {
		<-r.done
		if err := r.parts[0].err; ErrorKind(err) != KindConnection || !errors.Is(err, ErrConnection) {
			t.Errorf("queued request %d on a killed Redis: %v (kind %q), want kind connection", i, err, ErrorKind(err))
		}
		r.release()
	}
	if took := time.Since(start); took > timeout/5 {
		t.Errorf("failing 21 requests on a killed Redis took %v, want far less than the %v timeout", took, timeout)
	}
}
