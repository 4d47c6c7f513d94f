package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// countingNoop is the no-op service counting the calls it answers, so that
// a test sees which node a call reached.
type countingNoop struct {
	noopServer
	calls atomic.Uint64
}

// ShouldRateLimit counts the call and answers OK.
func (s *countingNoop) ShouldRateLimit(ctx context.Context, r *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	s.calls.Add(1)
	return s.noopServer.ShouldRateLimit(ctx, r)
}

// startCountingNoops serves n counting no-op services on free loopback
// ports for one test.
func startCountingNoops(t *testing.T, n int) ([]string, []*countingNoop) {
	t.Helper()
	addrs := make([]string, n)
	servers := make([]*countingNoop, n)
	for i := range n {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s := grpc.NewServer()
		servers[i] = &countingNoop{noopServer: noopServer{ok: &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}}}
		rlsv3.RegisterRateLimitServiceServer(s, servers[i])
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = s.Serve(lis)
		}()
		t.Cleanup(func() { s.Stop(); <-done })
		addrs[i] = lis.Addr().String()
	}
	return addrs, servers
}

func TestParseAddrs(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    []string
		wantErr string
	}{
		{nil, []string{"127.0.0.1:8081"}, ""},
		{[]string{"-addr", "a:1"}, []string{"a:1"}, ""},
		{[]string{"-addr", "a:1,b:2, c:3", "-c", "6"}, []string{"a:1", "b:2", "c:3"}, ""},
		{[]string{"-addr", "a:1,,b:2", "-c", "2"}, nil, `-addr "a:1,,b:2": empty address`},
		{[]string{"-addr", "a:1,"}, nil, `-addr "a:1,": empty address`},
		{[]string{"-addr", ""}, nil, `-addr "": empty address`},
		{[]string{"-addr", "a:1,b:2,a:1", "-c", "3"}, nil, "a:1 is listed twice"},
		{[]string{"-addr", "a:1,b:2,c:3"}, nil, "-c 64 does not spread evenly over 3 addresses: use a multiple of 3"},
		{[]string{"-addr", "a:1,b:2", "-c", "1"}, nil, "-c 1 does not spread evenly over 2 addresses"},
	} {
		s, err := parse(tc.args, io.Discard)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("parse(%q) = %v, want an error containing %q", tc.args, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("parse(%q): %v", tc.args, err)
			continue
		}
		if strings.Join(s.addrs, " ") != strings.Join(tc.want, " ") {
			t.Errorf("parse(%q) addrs = %q, want %q", tc.args, s.addrs, tc.want)
		}
	}
}

// TestRunLoadSpreadsOverAddrs: with three addresses, every node answers
// calls, each address' tally is the calls its server answered, and with a
// rate each node gets at most its share of it (pacing never starts a call
// early, so this holds however loaded the machine is).
func TestRunLoadSpreadsOverAddrs(t *testing.T) {
	addrs, servers := startCountingNoops(t, 3)
	pool, err := buildPool(poolOptions{Mix: mixHot, Domain: "edge"})
	if err != nil {
		t.Fatal(err)
	}
	const rate, callers = 300.0, 6
	window := 500 * time.Millisecond
	res, err := runLoad(context.Background(), loadOptions{
		Addrs: addrs, Callers: callers, Conns: 2, Duration: window, Pool: pool, Rate: rate,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.errors != 0 || len(res.perAddr) != len(addrs) {
		t.Fatalf("%d errors (first: %v), %d per-address tallies; want no errors and %d tallies", res.errors, res.firstError, len(res.perAddr), len(addrs))
	}
	var sum uint64
	share := uint64(rate/float64(len(addrs))*window.Seconds()) + callers/uint64(len(addrs))
	for i, a := range res.perAddr {
		got := servers[i].calls.Load()
		t.Logf("%s: %d calls counted, %d answered", addrs[i], a.ok, got)
		if a.ok == 0 || a.ok != got || a.overLimit != 0 || a.errors != 0 {
			t.Errorf("%s: tally ok %d, over %d, errors %d; server answered %d: want the same count, above 0", addrs[i], a.ok, a.overLimit, a.errors, got)
		}
		if a.ok > share {
			t.Errorf("%s: %d calls in %v, over its share of %v/s (%d)", addrs[i], a.ok, window, rate, share)
		}
		sum += a.ok
	}
	if sum != res.total() {
		t.Errorf("per-address calls add up to %d, want the total %d", sum, res.total())
	}
}

// TestRunPrintsEachAddress: the JSON line of a run over several addresses
// lists each one's answers; one address adds no list.
func TestRunPrintsEachAddress(t *testing.T) {
	addrs, _ := startCountingNoops(t, 3)
	for _, tc := range []struct {
		addr  string
		nAddr int
	}{{strings.Join(addrs, ","), 3}, {addrs[0], 0}} {
		args := []string{"-addr", tc.addr, "-c", "3", "-conns", "1", "-d", "200ms", "-warmup", "0s", "-mix", "hot"}
		var stdout bytes.Buffer
		if err := run(context.Background(), args, &stdout, io.Discard); err != nil {
			t.Fatalf("run(%q) = %v", args, err)
		}
		var o output
		if err := json.Unmarshal(stdout.Bytes(), &o); err != nil {
			t.Fatalf("output %q: %v", stdout.String(), err)
		}
		if len(o.Addrs) != tc.nAddr {
			t.Fatalf("-addr %s: addrs = %+v, want %d entries", tc.addr, o.Addrs, tc.nAddr)
		}
		var sum uint64
		for i, a := range o.Addrs {
			if a.Addr != addrs[i] || a.Total == 0 || a.OK != a.Total {
				t.Errorf("addrs[%d] = %+v, want %s with calls, all OK", i, a, addrs[i])
			}
			sum += a.Total
		}
		if tc.nAddr > 0 && sum != o.Total {
			t.Errorf("addrs add up to %d calls, want the total %d", sum, o.Total)
		}
	}
}
