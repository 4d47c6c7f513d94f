package redis

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/internal/redistest"
)

// gate is a go-redis hook that holds the first script calls until the test
// releases them, one value of release per call: it makes "Writers calls in
// flight" a state a test sets up, without timing.
type gate struct {
	hold    atomic.Int32  // calls still to hold
	entered chan uint64   // the key count of every script call, as it starts
	release chan struct{} // lets one held call go on
}

func newGate(hold int32) *gate {
	g := &gate{entered: make(chan uint64, 100), release: make(chan struct{})}
	g.hold.Store(hold)
	return g
}

func (*gate) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (g *gate) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			keys, _ := cmd.Args()[2].(*uint64)
			g.entered <- *keys
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

// next returns the key count of the next script call to start.
func (g *gate) next(t *testing.T) uint64 {
	t.Helper()
	select {
	case n := <-g.entered:
		return n
	case <-time.After(10 * time.Second):
		t.Fatalf("no script call within 10s")
		return 0
	}
}

// gated returns a Limiter on s whose client passes through a gate holding
// the first hold script calls after a warm-up (the script loaded, a
// connection in the pool).
func gated(t *testing.T, s *redistest.Server, opts Options, hold int32) (*Limiter, *gate) {
	t.Helper()
	o, err := ParseURL("redis://"+s.Addr(), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c := goredis.NewUniversalClient(o)
	t.Cleanup(func() { _ = c.Close() })
	g := newGate(0)
	c.AddHook(g)
	opts.Client, opts.Prefix, opts.CacheSize = c, t.Name(), -1
	l := New(opts)
	t.Cleanup(l.Close)
	if r := hitKey(l, 255); r.err != nil {
		t.Fatalf("warm-up: %v", r.err)
	}
	for len(g.entered) > 0 {
		<-g.entered
	}
	g.hold.Store(hold)
	return l, g
}

type result struct {
	ok   bool
	err  error
	took time.Duration
}

// hitAsync takes a token from bucket n in a new goroutine.
func hitAsync(l *Limiter, n byte) <-chan result {
	ch := make(chan result, 1)
	go func() { ch <- hitKey(l, n) }()
	return ch
}

func hitKey(l *Limiter, n byte) result {
	start := time.Now()
	lim := bucket.Limit{Requests: 1, Period: time.Hour, Burst: 10}
	states := make([]bucket.State, 1)
	d, err := l.Hit(context.Background(), []bucket.Hit{{Key: bucket.Key{n}, Limit: lim, Cost: 1}}, states)
	ok := d.Allowed
	return result{ok, err, time.Since(start)}
}

// waitQueued waits until n parts wait in t's queue.
func waitQueued(tb *testing.T, t *target, n int) {
	tb.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		t.mu.Lock()
		got := len(t.queue)
		t.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%d parts queued after 10s, want %d", got, n)
		}
		time.Sleep(time.Millisecond) // poll interval, bounded by the deadline
	}
}

// TestBatchSharesCall: with Writers calls in flight, new requests queue, and
// the first slot to free sends them all in one script call.
func TestBatchSharesCall(t *testing.T) {
	t.Parallel()
	l, g := gated(t, redistest.Start(t), Options{Writers: 2, Timeout: 10 * time.Second}, 2)
	a := hitAsync(l, 0)
	if n := g.next(t); n != 1 {
		t.Fatalf("first call: %d keys, want 1 (sent alone, at once)", n)
	}
	b := hitAsync(l, 1)
	if n := g.next(t); n != 1 {
		t.Fatalf("second call, one in flight: %d keys, want 1 (sent alone, at once)", n)
	}
	queued := []<-chan result{hitAsync(l, 2), hitAsync(l, 3), hitAsync(l, 4)}
	waitQueued(t, l.one, 3)
	g.release <- struct{}{}
	if n := g.next(t); n != 3 {
		t.Errorf("call after a slot freed: %d keys, want 3 (the three queued requests)", n)
	}
	g.release <- struct{}{}
	for i, ch := range append([]<-chan result{a, b}, queued...) {
		if r := <-ch; !r.ok || r.err != nil {
			t.Errorf("request %d: %v, %v; want allowed", i, r.ok, r.err)
		}
	}
	if len(g.entered) != 0 {
		t.Errorf("%d more script calls, want none", len(g.entered))
	}
}

// TestQueuedDeadline: a queued request whose call cannot go out gives up at
// its own deadline, with a timeout, and is then never sent.
func TestQueuedDeadline(t *testing.T) {
	t.Parallel()
	const timeout = 100 * time.Millisecond
	l, g := gated(t, redistest.Start(t), Options{Writers: 1, Timeout: timeout}, 1)
	a := hitAsync(l, 0)
	g.next(t)
	r := hitKey(l, 1) // queued behind a
	if !errors.Is(r.err, context.DeadlineExceeded) || ErrorKind(r.err) != KindTimeout {
		t.Errorf("queued request: %v (kind %q), want kind timeout", r.err, ErrorKind(r.err))
	}
	if r.took < timeout || r.took > timeout+time.Second {
		t.Errorf("queued request gave up after %v, want ≈ %v", r.took, timeout)
	}
	g.release <- struct{}{}
	<-a
	l.Close() // the writer that found the abandoned request has exited
	if len(g.entered) != 0 {
		t.Errorf("the abandoned request was sent (%d more script calls), want none", len(g.entered))
	}
}

// TestKilledFailsQueued: when Redis dies, the call in flight and every
// request queued behind it fail at once with a connection error, long
// before the Timeout.
func TestKilledFailsQueued(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	const timeout = 5 * time.Second
	l, g := gated(t, s, Options{Writers: 1, Timeout: timeout}, 1)
	inFlight := hitAsync(l, 0)
	g.next(t)
	var queued []<-chan result
	for i := range 20 {
		queued = append(queued, hitAsync(l, byte(1+i)))
	}
	waitQueued(t, l.one, 20)
	s.Kill()
	start := time.Now()
	g.release <- struct{}{}
	for i, ch := range append([]<-chan result{inFlight}, queued...) {
		r := <-ch
		if ErrorKind(r.err) != KindConnection || !errors.Is(r.err, ErrConnection) {
			t.Errorf("request %d on a killed Redis: %v (kind %q), want kind connection", i, r.err, ErrorKind(r.err))
		}
	}
	if took := time.Since(start); took > timeout/5 {
		t.Errorf("failing 21 requests on a killed Redis took %v, want far less than the %v timeout", took, timeout)
	}
}

// TestCloseFailsQueued: Close fails queued requests at once, waits for the
// call in flight, and later calls fail.
func TestCloseFailsQueued(t *testing.T) {
	t.Parallel()
	l, g := gated(t, redistest.Start(t), Options{Writers: 1, Timeout: 10 * time.Second}, 1)
	a := hitAsync(l, 0)
	g.next(t)
	q := hitAsync(l, 1)
	waitQueued(t, l.one, 1)
	closed := make(chan struct{})
	go func() { l.Close(); close(closed) }()
	if r := <-q; ErrorKind(r.err) != KindConnection || !errors.Is(r.err, ErrConnection) {
		t.Errorf("request queued at Close: %v (kind %q), want kind connection", r.err, ErrorKind(r.err))
	}
	select {
	case <-closed:
		t.Errorf("Close returned with a script call in flight")
	default:
	}
	g.release <- struct{}{}
	if r := <-a; !r.ok || r.err != nil {
		t.Errorf("call in flight at Close: %v, %v; want allowed", r.ok, r.err)
	}
	<-closed
	if r := hitKey(l, 2); ErrorKind(r.err) != KindConnection {
		t.Errorf("Hit after Close: %v, want kind connection", r.err)
	}
}
