//go:build integration && linux

package integration

import (
	"bufio"
	"context"
	"errors"
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

// badConn is one misbehaving client connection and when the server closed it.
type badConn struct {
	kind   string
	closed chan time.Duration // how long after start the server closed it; -1: it did not
}

// TestSlowAndIdleClientsDoNotStarveGRPC runs rls with a descriptor limit of
// what it has open plus 48, then opens 70 misbehaving connections: slow
// /json bodies, idle HTTP keep-alives, gRPC connections that never
// handshake and ones that send the HTTP/2 preface and idle. A new gRPC call
// must still succeed, and the server must close every one of them.
func TestSlowAndIdleClientsDoNotStarveGRPC(t *testing.T) {
	t.Parallel()
	p := startRLS(t,
		"--http-read-timeout", "500ms", "--http-write-timeout", "500ms", "--http-idle-timeout", "500ms",
		"--http-max-conns", "8", "--grpc-handshake-timeout", "500ms", "--grpc-max-conn-idle", "500ms")
	pid := p.cmd.Process.Pid
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	var lim unix.Rlimit
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &lim); err != nil {
		t.Fatal(err)
	}
	lim.Cur = uint64(len(fds) + 48)
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("rls has %d descriptors open; limit set to %d", len(fds), lim.Cur)

	start := time.Now()
	var conns []badConn
	open := func(kind, addr, send string) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		t.Cleanup(func() { c.Close() })
		if send != "" {
			if _, err := io.WriteString(c, send); err != nil {
				t.Fatalf("%s: write: %v", kind, err)
			}
		}
		b := badConn{kind: kind, closed: make(chan time.Duration, 1)}
		conns = append(conns, b)
		go func() {
			// Read whatever the server answers until it closes the
			// connection; give up after 30 s.
			_ = c.SetReadDeadline(start.Add(30 * time.Second))
			_, err := io.Copy(io.Discard, c)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				b.closed <- -1
				return
			}
			b.closed <- time.Since(start)
		}()
	}
	for range 30 {
		open("slow /json body", p.AdminAddr, "POST /json HTTP/1.1\r\nHost: rls\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"domain\"")
		open("idle keep-alive", p.HTTPAddr, "GET /healthcheck HTTP/1.1\r\nHost: rls\r\n\r\n")
	}
	for range 5 {
		open("gRPC, no handshake", p.GRPCAddr, "")
		open("gRPC, preface then idle", p.GRPCAddr, http2.ClientPreface+"\x00\x00\x00\x04\x00\x00\x00\x00\x00") // an empty SETTINGS frame
	}

	// A new gRPC call, on a new connection, while all of them are open.
	conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	callStart := time.Now()
	_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, request("edge", "user_id=new"))
	if err != nil {
		t.Errorf("new gRPC call with %d bad connections open: %v", len(conns), err)
	} else {
		t.Logf("new gRPC call answered in %v with %d bad connections open", time.Since(callStart).Round(time.Millisecond), len(conns))
	}

	// Every bad connection is closed by the server: the HTTP ones within a
	// few rounds of 500 ms (8 at a time per listener), the gRPC ones within
	// the handshake timeout, or the idle limit plus gRPC's 5 s GOAWAY grace.
	bound := map[string]time.Duration{
		"slow /json body":         10 * time.Second,
		"idle keep-alive":         10 * time.Second,
		"gRPC, no handshake":      5 * time.Second,
		"gRPC, preface then idle": 15 * time.Second,
	}
	took := make(map[string][]time.Duration)
	for _, c := range conns {
		d := <-c.closed
		switch {
		case d < 0:
			t.Errorf("%s: still open after 30 s", c.kind)
			continue
		case d > bound[c.kind]:
			t.Errorf("%s: closed after %v, want within %v", c.kind, d, bound[c.kind])
		}
		took[c.kind] = append(took[c.kind], d)
	}
	for kind, ds := range took {
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		t.Logf("%s: %d closed by the server after %v to %v", kind, len(ds), ds[0].Round(time.Millisecond), ds[len(ds)-1].Round(time.Millisecond))
	}
	if got := p.Check(t, "edge", "user_id=after").GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Errorf("gRPC after the bad connections closed: %v", got)
	}
}

// TestGRPCKeepaliveEnforcement: a client may ping every
// --grpc-keepalive-min-time without a call in flight; a ping flood gets
// GOAWAY ENHANCE_YOUR_CALM and the connection is closed.
func TestGRPCKeepaliveEnforcement(t *testing.T) {
	t.Parallel()
	p := startRLS(t, "--grpc-keepalive-min-time", "100ms", "--grpc-max-conn-idle", "0")
	c, err := net.Dial("tcp", p.GRPCAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, bufio.NewReader(c))
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	// readUntil reads frames until want returns true; a GOAWAY is returned.
	readUntil := func(want func(http2.Frame) bool) *http2.GoAwayFrame {
		t.Helper()
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				t.Fatalf("reading frames: %v", err)
			}
			if ga, ok := f.(*http2.GoAwayFrame); ok {
				return ga
			}
			if sf, ok := f.(*http2.SettingsFrame); ok && !sf.IsAck() {
				if err := fr.WriteSettingsAck(); err != nil {
					t.Fatal(err)
				}
			}
			if want(f) {
				return nil
			}
		}
	}
	isAck := func(data [8]byte) func(http2.Frame) bool {
		return func(f http2.Frame) bool {
			pf, ok := f.(*http2.PingFrame)
			return ok && pf.IsAck() && pf.Data == data
		}
	}
	// Allowed: 5 pings 400 ms apart (4 × the minimum), no call in flight.
	for i := range 5 {
		data := [8]byte{1, byte(i)}
		if err := fr.WritePing(false, data); err != nil {
			t.Fatal(err)
		}
		if ga := readUntil(isAck(data)); ga != nil {
			t.Fatalf("ping %d, 400 ms after the previous one: GOAWAY %v %q", i, ga.ErrCode, ga.DebugData())
		}
		time.Sleep(400 * time.Millisecond) // the pace under test, not a wait for state
	}
	// A flood: GOAWAY ENHANCE_YOUR_CALM, then the connection closes.
	for i := range 10 {
		if err := fr.WritePing(false, [8]byte{2, byte(i)}); err != nil {
			break // already closed
		}
	}
	ga := readUntil(func(http2.Frame) bool { return false })
	if ga.ErrCode != http2.ErrCodeEnhanceYourCalm {
		t.Errorf("GOAWAY after a ping flood: %v %q, want ENHANCE_YOUR_CALM", ga.ErrCode, ga.DebugData())
	}
	if _, err := io.Copy(io.Discard, c); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("connection still open 30 s after the GOAWAY")
		}
	}
}

// TestPprofProfileOutlivesWriteTimeout: a CPU profile longer than
// --http-write-timeout is still served in full (net/http/pprof adds the
// profile's duration to the server's WriteTimeout).
func TestPprofProfileOutlivesWriteTimeout(t *testing.T) {
	t.Parallel()
	p := startRLS(t, "--pprof", "--http-write-timeout", "1s")
	start := time.Now()
	code, body := p.AdminGet(t, "/debug/pprof/profile?seconds=2")
	if code != 200 || len(body) == 0 {
		t.Errorf("2 s profile with a 1 s write timeout: %d, %d bytes: %.200q", code, len(body), body)
	}
	if d := time.Since(start); d < 2*time.Second {
		t.Errorf("profile answered after %v, before its 2 s", d)
	}
}

// TestGRPCMaxConnAge: a connection older than --grpc-max-conn-age gets
// GOAWAY, so that Envoy's long-lived
// connections spread over replicas added since.
func TestGRPCMaxConnAge(t *testing.T) {
	t.Parallel()
	p := startRLS(t, "--grpc-max-conn-age", "300ms", "--grpc-max-conn-age-grace", "200ms", "--grpc-max-conn-idle", "0")
	c, err := net.Dial("tcp", p.GRPCAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	_ = c.SetDeadline(start.Add(30 * time.Second))
	if _, err := io.WriteString(c, http2.ClientPreface); err != nil {
		t.Fatal(err)
	}
	fr := http2.NewFramer(c, bufio.NewReader(c))
	if err := fr.WriteSettings(); err != nil {
		t.Fatal(err)
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("no GOAWAY before the connection ended: %v", err)
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				_ = fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				_ = fr.WritePing(true, f.Data)
			}
		case *http2.GoAwayFrame:
			// grpc-go jitters the age by ±10%.
			if age := time.Since(start); age < 270*time.Millisecond {
				t.Errorf("GOAWAY after %v, before --grpc-max-conn-age 300ms", age)
			}
			if f.ErrCode != http2.ErrCodeNo || string(f.DebugData()) != "max_age" {
				t.Errorf("GOAWAY %v %q, want NO_ERROR max_age", f.ErrCode, f.DebugData())
			}
			return
		}
	}
}
