package node

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-rls/sluice/internal/pkitest"
)

// silentHTTP2 dials addr and sends the HTTP/2 client preface and an empty
// SETTINGS frame, as a client that then never starts a call.
func silentHTTP2(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"); err != nil {
		t.Fatal(err)
	}
	return c
}

// closedWithin reads c until the server closes it and returns how long
// that took; -1 if it was still open at the deadline.
func closedWithin(c net.Conn, deadline time.Duration) time.Duration {
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(deadline))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return -1
	}
	return time.Since(start)
}

// call makes one ShouldRateLimit call on c.
func call(c rlsv3.RateLimitServiceClient) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.ShouldRateLimit(ctx, edgeRequest("user_id", "conns"))
	return err
}

// TestSilentHTTP2ConnectionClosed: a connection that sends the HTTP/2
// preface and SETTINGS and then nothing is closed within
// GRPCFirstCallTimeout (--grpc-first-call-timeout's default, 5 s); a
// connection that made a call stays open past it, and the closure is
// counted.
func TestSilentHTTP2ConnectionClosed(t *testing.T) {
	s := start(t, testOptions())
	addr := s.Addrs().GRPC.String()
	client := s.Client()
	if err := call(client); err != nil {
		t.Fatal(err)
	}
	silent := silentHTTP2(t, addr)
	held := closedWithin(silent, 15*time.Second)
	t.Logf("silent HTTP/2 connection closed after %v", held)
	if held < 0 {
		t.Fatalf("a connection that sent the preface and SETTINGS and then nothing is still open after 15 s")
	}
	if err := call(client); err != nil {
		t.Errorf("a call on the connection that made one before, past the bound: %v", err)
	}
	if _, metrics := httpGet(t, s.HTTP()+"/metrics"); !strings.Contains(metrics, "ratelimit_grpc_connections_closed_no_call_total 1\n") {
		t.Errorf("/metrics does not count one connection closed without a call:\n%s", grepLines(metrics, "ratelimit_grpc_connections"))
	}
}

// TestSilentHTTP2ConnectionClosedTLS: over TLS the bound starts after the
// handshake, and a silent connection is closed as in plaintext, while a
// TLS call before and after it succeeds.
func TestSilentHTTP2ConnectionClosedTLS(t *testing.T) {
	p := pkitest.New(t)
	opts := testOptions()
	opts.GRPCFirstCallTimeout = 2 * time.Second
	opts.TLSCert, opts.TLSKey, opts.TLSClientCA = p.ServerCert, p.ServerKey, p.CA
	addr := start(t, opts).Addrs().GRPC.String()
	conn := p.DialGRPC(t, addr, p.Client)
	if _, err := pkitest.ServerSerial(t, conn); err != nil {
		t.Fatal(err)
	}
	raw, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, &tls.Config{
		RootCAs: p.Roots, ServerName: pkitest.ServerName, Certificates: []tls.Certificate{p.Client}, NextProtos: []string{"h2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	if _, err := io.WriteString(raw, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"); err != nil {
		t.Fatal(err)
	}
	held := closedWithin(raw, 10*time.Second)
	t.Logf("silent HTTP/2 connection over TLS closed after %v (bound 2 s)", held)
	if held < 0 {
		t.Fatal("a TLS connection that sent the preface and SETTINGS and then nothing is still open after 10 s")
	}
	if _, err := pkitest.ServerSerial(t, conn); err != nil {
		t.Errorf("a TLS call on the connection that made one before, past the bound: %v", err)
	}
}

// TestGRPCMaxConns: with GRPCMaxConns 2 and two connections open, a
// third waits (the server says nothing on it) while calls on the two
// succeed and /healthcheck answers; when one closes, the third is served.
func TestGRPCMaxConns(t *testing.T) {
	opts := testOptions()
	opts.GRPCMaxConns = 2
	s := start(t, opts)
	addr := s.Addrs().GRPC.String()
	connA := dial(t, addr)
	a, b := rlsv3.NewRateLimitServiceClient(connA), s.Client()
	if err := call(a); err != nil {
		t.Fatal(err)
	}
	if err := call(b); err != nil {
		t.Fatal(err)
	}
	third := silentHTTP2(t, addr)
	_ = third.SetReadDeadline(time.Now().Add(time.Second))
	if n, err := third.Read(make([]byte, 64)); n > 0 || !isTimeout(err) {
		t.Errorf("third connection over the cap: read %d bytes, %v; want nothing (waiting to be accepted)", n, err)
	}
	if err := call(a); err != nil {
		t.Errorf("a call on an open connection at the cap: %v", err)
	}
	if code, body := httpGet(t, s.HTTP()+"/healthcheck"); code != http.StatusOK {
		t.Errorf("/healthcheck at the gRPC cap: %d %q", code, body)
	}
	if _, metrics := httpGet(t, s.HTTP()+"/metrics"); !strings.Contains(metrics, "ratelimit_grpc_connections_open 2\n") ||
		!strings.Contains(metrics, "ratelimit_grpc_connections_max 2\n") {
		t.Errorf("/metrics at the cap:\n%s", grepLines(metrics, "ratelimit_grpc_connections"))
	}
	_ = connA.Close()
	_ = third.SetReadDeadline(time.Now().Add(10 * time.Second))
	hdr := make([]byte, 9)
	if _, err := io.ReadFull(third, hdr); err != nil || hdr[3] != 0x4 {
		t.Errorf("third connection after one closed: %v, frame header %x; want the server's SETTINGS", err, hdr)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
