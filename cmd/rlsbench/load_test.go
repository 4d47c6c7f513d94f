package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// startTestNoop serves the no-op RLS on a free loopback port for one test.
func startTestNoop(t *testing.T) string {
	t.Helper()
	addr, stop, err := startNoop("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return addr
}

func TestRunLoadAgainstNoop(t *testing.T) {
	addr := startTestNoop(t)
	pool, err := buildPool(poolOptions{Mix: mixEnvoy, Domain: "edge", Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	var edges []bool
	res, err := runLoad(context.Background(), loadOptions{
		Addrs:    []string{addr},
		Callers:  4,
		Conns:    2,
		Warmup:   50 * time.Millisecond,
		Duration: 300 * time.Millisecond,
		Pool:     pool,
		Window:   func(start bool) { edges = append(edges, start) },
	})
	if err != nil {
		t.Fatal(err)
	}
	out := summarize(settings{callers: 4, conns: 2, pool: poolOptions{Mix: mixEnvoy}}, res)
	if out.WarmupCalls != res.warmup {
		t.Errorf("warmup_calls = %d, want the %d calls of the warmup", out.WarmupCalls, res.warmup)
	}
	if out.QPS <= 0 {
		t.Errorf("qps = %v, want > 0", out.QPS)
	}
	if res.errors != 0 {
		t.Errorf("errors = %d (first: %v), want 0", res.errors, res.firstError)
	}
	if res.ok != res.total() || res.total() == 0 {
		t.Errorf("ok = %d of %d calls, want all of at least one", res.ok, res.total())
	}
	if res.hist.n != res.total() {
		t.Errorf("histogram holds %d latencies, want one per call (%d)", res.hist.n, res.total())
	}
	if out.P50 <= 0 || out.P50 > out.P99 || out.P99 > out.P999 || out.P999 > out.Max {
		t.Errorf("percentiles p50 %v, p99 %v, p99.9 %v, max %v: want 0 < p50 ≤ p99 ≤ p99.9 ≤ max", out.P50, out.P99, out.P999, out.Max)
	}
	if want := []bool{true, false}; len(edges) != 2 || edges[0] != want[0] || edges[1] != want[1] {
		t.Errorf("window edges = %v, want %v", edges, want)
	}
}

// TestRunLoadPaced: with a rate, the callers together start at most that
// many calls per second (unpaced, the no-op answers thousands in the window).
func TestRunLoadPaced(t *testing.T) {
	addr := startTestNoop(t)
	pool, err := buildPool(poolOptions{Mix: mixHot, Domain: "edge"})
	if err != nil {
		t.Fatal(err)
	}
	const rate, callers = 100.0, 4
	window := 500 * time.Millisecond
	res, err := runLoad(context.Background(), loadOptions{
		Addrs: []string{addr}, Callers: callers, Conns: 1, Warmup: 50 * time.Millisecond, Duration: window, Pool: pool, Rate: rate,
	})
	if err != nil {
		t.Fatal(err)
	}
	if max := uint64(rate*window.Seconds()) + callers; res.total() == 0 || res.total() > max || res.errors != 0 {
		t.Errorf("paced at %v/s for %v: %d calls (%d errors), want 1 to %d and no errors", rate, window, res.total(), res.errors, max)
	}
	if _, err := runLoad(context.Background(), loadOptions{Addrs: []string{addr}, Callers: 1, Conns: 1, Duration: window, Pool: pool, Rate: -1}); err == nil {
		t.Errorf("runLoad with a negative rate: no error")
	}
}

// countingServer answers OK, as the no-op does, and calls seen with the
// number of calls answered so far.
type countingServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
	n    atomic.Int64
	seen func(n int64)
}

func (s *countingServer) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	s.seen(s.n.Add(1))
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

// TestRunLoadCountsWarmup: every call that starts in the warmup counts
// there, and none in the measured window. The warmup lasts an hour, and
// the test ends the run once the server has answered 20 calls, so that no
// pause of a busy machine can end the warmup first.
func TestRunLoadCountsWarmup(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const calls = 20
	srv := &countingServer{seen: func(n int64) {
		if n == calls {
			cancel()
		}
	}}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	defer gs.Stop()
	pool, err := buildPool(poolOptions{Mix: mixHot, Domain: "edge"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := runLoad(ctx, loadOptions{Addrs: []string{lis.Addr().String()}, Callers: 2, Conns: 1, Warmup: time.Hour, Duration: time.Millisecond, Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	if res.warmup < calls || res.total() != 0 || res.hist.n != 0 {
		t.Errorf("warmup %d calls, measured %d (%d latencies); want at least the %d the server answered in the warmup, none measured",
			res.warmup, res.total(), res.hist.n, calls)
	}
}

func TestRunPrintsOneJSONLine(t *testing.T) {
	addr := startTestNoop(t)
	args := []string{"-addr", addr, "-c", "4", "-conns", "2", "-d", "300ms", "-warmup", "50ms",
		"-mix", "hot", "-backend", "noop", "-tag", "t"}
	onLinux := runtime.GOOS == "linux"
	if onLinux { // the no-op serves in this process: its CPU is ours
		args = append(args, "-server-pid", strconv.Itoa(os.Getpid()))
	}
	var stdout, stderr bytes.Buffer
	cpu0, err := processCPU(os.Getpid())
	if onLinux && err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("run(%q) = %v; stderr: %s", args, err, stderr.String())
	}
	cpu1, err := processCPU(os.Getpid())
	if onLinux && err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("run printed %d lines, want 1:\n%s", len(lines), stdout.String())
	}
	var o output
	if err := json.Unmarshal([]byte(lines[0]), &o); err != nil {
		t.Fatalf("output %q: %v", lines[0], err)
	}
	if o.Mix != "hot" || o.Backend != "noop" || o.Tag != "t" || o.C != 4 || o.Conns != 2 || o.DurationSec != 0.3 || o.WarmupSec != 0.05 {
		t.Errorf("output labels = %+v, want mix hot, backend noop, tag t, c 4, conns 2, duration 0.3s, warmup 0.05s", o)
	}
	// Whether the warmup made a call depends on the machine's load: a busy
	// one can start the callers after it (TestRunLoadCountsWarmup counts it).
	if o.QPS <= 0 || o.Errors != 0 || o.OK != o.Total {
		t.Errorf("output = qps %v, errors %d, ok %d of %d; want qps > 0, no errors, all ok", o.QPS, o.Errors, o.OK, o.Total)
	}
	if !onLinux {
		return
	}
	// The server's CPU in the window is this process', read with a 10 ms
	// resolution: on a busy machine the window may be charged none, but
	// never more than the whole run was.
	if o.ServerCPUMicros == nil || o.OtherCPUCores == nil {
		t.Fatalf("server_cpu_us_per_req = %v, other_cpu_cores = %v; want both set", o.ServerCPUMicros, o.OtherCPUCores)
	}
	if server := time.Duration(*o.ServerCPUMicros * float64(o.Total) * float64(time.Microsecond)); server < 0 || server > cpu1-cpu0+time.Microsecond {
		t.Errorf("server CPU in the window = %v (%v µs × %d requests), want 0 to the %v this process used in the whole run",
			server, *o.ServerCPUMicros, o.Total, cpu1-cpu0)
	}
}

func TestRunLoadFailsFastWhenNothingListens(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	pool, _ := buildPool(poolOptions{Mix: mixHot})
	_, err = runLoad(ctx, loadOptions{Addrs: []string{addr}, Callers: 1, Conns: 1, Duration: time.Second, Pool: pool})
	if err == nil || !strings.Contains(err.Error(), "connect to "+addr) {
		t.Errorf("runLoad against a closed port = %v, want a connect error", err)
	}
}

func TestServeNoopLogsAndStops(t *testing.T) {
	var log bytes.Buffer
	err := serveNoop(context.Background(), "127.0.0.1:0", 50*time.Millisecond, slog.New(slog.NewTextHandler(&log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log.String(), "msg=serving grpc_addr=127.0.0.1:") {
		t.Errorf("log = %q, want msg=serving grpc_addr=127.0.0.1:PORT", log.String())
	}
}
