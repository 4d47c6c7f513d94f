package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
)

// grace is how long a call started in the measured window may run past its
// end before it is cancelled (and counted as an error), so that a run
// always ends by itself.
const grace = 5 * time.Second

// connectTimeout bounds the wait for every connection to be ready.
const connectTimeout = 5 * time.Second

// loadOptions configures one closed-loop run.
type loadOptions struct {
	// Addrs are the gRPC addresses of the service's nodes: caller i calls
	// Addrs[i % len(Addrs)], so every node gets an equal share of the
	// callers when Callers is a multiple of len(Addrs).
	Addrs   []string
	Callers int
	// Conns is the gRPC connections to each address; an address's callers
	// are spread over its connections round-robin.
	Conns    int
	Warmup   time.Duration
	Duration time.Duration
	Pool     []*rlsv3.RateLimitRequest
	// Rate, when positive, caps the calls per second of all callers
	// together: each caller starts its calls Callers/Rate seconds apart
	// (sooner never; later when an answer takes longer). Zero is a plain
	// closed loop.
	Rate float64
	// Window, when set, is called (on its own goroutine) at the start and
	// at the end of the measured window, with start true then false.
	Window func(start bool)
}

// loadResult is what the callers saw in the measured window.
type loadResult struct {
	hist       *histogram
	ok         uint64
	overLimit  uint64
	errors     uint64
	warmup     uint64 // calls started during the warmup, not measured
	firstError error
	window     time.Duration
	// perAddr holds the measured answers of each address, in Addrs' order.
	perAddr []tally
}

// tally counts the measured answers of one address.
type tally struct {
	ok, overLimit, errors uint64
}

func (r *loadResult) total() uint64 { return r.ok + r.overLimit + r.errors }

// caller is one closed-loop caller's private tally: no sharing, no locks.
type caller struct {
	loadResult
	client rlsv3.RateLimitServiceClient
	addr   int           // index of its address in loadOptions.Addrs
	next   int           // index of its next request in the pool
	every  time.Duration // with a rate: time between its starts
	due    time.Time     // with a rate: when its next call may start
}

// runLoad runs o.Callers closed-loop callers, spread round-robin over
// o.Addrs and over o.Conns gRPC connections to each, for o.Warmup then
// o.Duration, and merges their tallies. Each caller sends its next pre-built request as soon as the
// previous answer arrives (and, with o.Rate, its next start is due). A call
// counts in the window it starts in; one still running grace after the end
// is cancelled.
func runLoad(ctx context.Context, o loadOptions) (loadResult, error) {
	if len(o.Addrs) == 0 || o.Callers < len(o.Addrs) || o.Conns < 1 || len(o.Pool) == 0 || o.Duration <= 0 || o.Warmup < 0 || o.Rate < 0 {
		return loadResult{}, fmt.Errorf("need addresses, connections and requests ≥ 1, callers ≥ addresses, a positive duration, a non-negative warmup and rate")
	}
	conns, err := dial(ctx, o.Addrs, o.Conns)
	if err != nil {
		return loadResult{}, err
	}
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()

	t0 := time.Now()
	warmEnd := t0.Add(o.Warmup)
	end := warmEnd.Add(o.Duration)
	ctx, cancel := context.WithDeadline(ctx, end.Add(grace))
	defer cancel()

	callers := make([]*caller, o.Callers)
	var wg sync.WaitGroup
	for i := range callers {
		c := &caller{
			loadResult: loadResult{hist: newHistogram()},
			// conns[j] is a connection to Addrs[j % len(Addrs)] (see dial).
			client: rlsv3.NewRateLimitServiceClient(conns[i%len(conns)]),
			addr:   i % len(o.Addrs),
			next:   i * len(o.Pool) / o.Callers,
		}
		if o.Rate > 0 {
			c.every = time.Duration(float64(o.Callers) / o.Rate * float64(time.Second))
			c.due = t0.Add(c.every * time.Duration(i) / time.Duration(o.Callers)) // staggered
		}
		callers[i] = c
		wg.Go(func() { c.loop(ctx, o.Pool, warmEnd, end) })
	}
	if o.Window != nil {
		wg.Go(func() { window(ctx, warmEnd, end, o.Window) })
	}
	wg.Wait()

	res := loadResult{hist: newHistogram(), window: o.Duration, perAddr: make([]tally, len(o.Addrs))}
	for _, c := range callers {
		a := &res.perAddr[c.addr]
		a.ok += c.ok
		a.overLimit += c.overLimit
		a.errors += c.errors
		res.hist.merge(c.hist)
		res.ok += c.ok
		res.overLimit += c.overLimit
		res.errors += c.errors
		res.warmup += c.warmup
		if res.firstError == nil {
			res.firstError = c.firstError
		}
	}
	return res, nil
}

// loop is one caller: call, time, tally, until the window ends.
func (c *caller) loop(ctx context.Context, pool []*rlsv3.RateLimitRequest, warmEnd, end time.Time) {
	for {
		if c.every > 0 {
			if wait := time.Until(c.due); wait > 0 {
				time.Sleep(wait) // pacing: at most until the next start is due
			}
			// A late caller starts at once, without a burst to catch up.
			c.due = later(c.due.Add(c.every), time.Now())
		}
		start := time.Now()
		if !start.Before(end) || ctx.Err() != nil {
			return
		}
		req := pool[c.next]
		if c.next++; c.next == len(pool) {
			c.next = 0
		}
		resp, err := c.client.ShouldRateLimit(ctx, req)
		elapsed := time.Since(start)
		if start.Before(warmEnd) {
			c.warmup++
			continue
		}
		c.hist.record(elapsed)
		switch {
		case err != nil:
			c.fail(err)
		case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
			c.ok++
		case resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
			c.overLimit++
		default:
			c.fail(fmt.Errorf("overall code %v", resp.GetOverallCode()))
		}
	}
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func (c *caller) fail(err error) {
	c.errors++
	if c.firstError == nil {
		c.firstError = err
	}
}

// window calls f(true) at warmEnd and f(false) at end, unless ctx ends
// first.
func window(ctx context.Context, warmEnd, end time.Time, f func(start bool)) {
	for _, edge := range []struct {
		at    time.Time
		start bool
	}{{warmEnd, true}, {end, false}} {
		t := time.NewTimer(time.Until(edge.at))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
			f(edge.start)
		}
	}
}

// dial opens n connections to each address, in rounds (one to every
// address, then the next round), so that connection j goes to
// addrs[j % len(addrs)], and waits until all are ready, so that connection
// setup is never measured and a wrong address fails fast.
func dial(ctx context.Context, addrs []string, n int) ([]*grpc.ClientConn, error) {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	conns := make([]*grpc.ClientConn, 0, n*len(addrs))
	closeAll := func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}
	for range n {
		for _, addr := range addrs {
			c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				closeAll()
				return nil, fmt.Errorf("connect to %s: %w", addr, err)
			}
			conns = append(conns, c)
			c.Connect()
		}
	}
	for j, c := range conns {
		for s := c.GetState(); s != connectivity.Ready; s = c.GetState() {
			if !c.WaitForStateChange(ctx, s) {
				closeAll()
				return nil, fmt.Errorf("connect to %s: %w (last state %v)", addrs[j%len(addrs)], ctx.Err(), s)
			}
		}
	}
	return conns, nil
}
