//go:build integration && linux

package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestSilentHTTP2FloodAtTheCap runs rls with a descriptor limit of what it
// has open plus 100 and --grpc-max-conns 64, then opens 200 connections
// that send the HTTP/2 preface and SETTINGS and nothing else (more than the
// descriptors left). Calls on the connection opened before keep being
// answered and /healthcheck keeps answering, since the cap keeps the flood
// below the descriptor limit; the flood is closed 64 at a time after
// --grpc-first-call-timeout, and a new connection is then served.
func TestSilentHTTP2FloodAtTheCap(t *testing.T) {
	t.Parallel()
	p := startRLS(t, "--grpc-max-conns", "64", "--grpc-first-call-timeout", "1s")
	if got := p.Check(t, "edge", "user_id=before").GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("call before the flood: %v", got)
	}
	pid := p.cmd.Process.Pid
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	var lim unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &lim); err != nil {
		t.Fatal(err)
	}
	lim.Cur = uint64(len(fds) + 100)
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
		t.Fatal(err)
	}

	start := time.Now()
	const flood = 200
	closed := make(chan time.Duration, flood)
	for range flood {
		c, err := net.DialTimeout("tcp", p.GRPCAddr, 10*time.Second)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, http2.ClientPreface+"\x00\x00\x00\x04\x00\x00\x00\x00\x00"); err != nil {
			t.Fatal(err)
		}
		go func() {
			_ = c.SetReadDeadline(start.Add(60 * time.Second))
			_, err := io.Copy(io.Discard, c)
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				closed <- -1
				return
			}
			closed <- time.Since(start)
		}()
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := p.Client.ShouldRateLimit(ctx, request("edge", "user_id=during")); err != nil {
		t.Errorf("call on the connection opened before, during the flood: %v", err)
	}
	if code, body := p.HTTPGet(t, "/healthcheck"); code != 200 {
		t.Errorf("/healthcheck during the flood: %d %q", code, body)
	}

	conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel2()
	if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx2, request("edge", "user_id=new")); err != nil {
		t.Errorf("call on a new connection behind the flood: %v", err)
	} else {
		t.Logf("a new connection behind %d silent ones was served after %v", flood, time.Since(start).Round(time.Millisecond))
	}
	var took []time.Duration
	for range flood {
		if d := <-closed; d < 0 {
			t.Errorf("a silent connection still open after 60 s")
		} else {
			took = append(took, d)
		}
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	if len(took) > 0 {
		t.Logf("%d silent connections closed by the server after %v to %v", len(took), took[0].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))
	}
}
