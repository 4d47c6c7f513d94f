package node

import (
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
)

// http2Preface is the length of the client connection preface
// ("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") that precedes a client's frames.
const http2Preface = 24

// http2FrameHeaders is the type of an HTTP/2 HEADERS frame: a call starts.
const http2FrameHeaders = 0x1

// grpcConns bounds the gRPC listener's connections: at most max open at
// once (the others wait in the kernel's backlog, holding no descriptor),
// and a connection that starts no call within firstCall is closed.
//
// grpc-go bounds the TLS handshake and the HTTP/2 preface
// (--grpc-handshake-timeout), but once a client has sent the preface and
// its SETTINGS, a connection without calls is only closed by
// MaxConnectionIdle (GOAWAY, which a hostile client ignores) or by the
// keepalive ping it does not answer: 60 s + 20 s. Nothing in grpc-go's
// options says "a stream must arrive", so the connection handed to gRPC
// after the handshake reads the client's frame headers until the first
// HEADERS frame, and is closed if none came within firstCall.
type grpcConns struct {
	max       int
	firstCall time.Duration // 0: no bound
	open      atomic.Int64
	noCall    prometheus.Counter
}

// newGRPCConns registers ratelimit_grpc_connections_open,
// ratelimit_grpc_connections_max and
// ratelimit_grpc_connections_closed_no_call_total on reg.
func newGRPCConns(max int, firstCall time.Duration, reg prometheus.Registerer) *grpcConns {
	g := &grpcConns{max: max, firstCall: firstCall}
	g.noCall = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ratelimit_grpc_connections_closed_no_call_total",
		Help: "gRPC connections closed because they started no call within --grpc-first-call-timeout of their handshake.",
	})
	reg.MustRegister(g.noCall,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ratelimit_grpc_connections_open",
			Help: "gRPC connections accepted and not yet closed; at --grpc-max-conns, new ones wait in the kernel's backlog.",
		}, func() float64 { return float64(g.open.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "ratelimit_grpc_connections_max",
			Help: "--grpc-max-conns: the most gRPC connections open at once (0: no cap).",
		}, func() float64 { return float64(max) }))
	return g
}

// listener returns lis counted and capped at g.max.
func (g *grpcConns) listener(lis net.Listener) net.Listener {
	return limitConns(&countingListener{Listener: lis, open: &g.open}, g.max)
}

// serverOption returns the gRPC option that puts the first-call bound on
// each connection after creds' handshake (creds nil: plaintext).
func (g *grpcConns) serverOption(creds credentials.TransportCredentials) grpc.ServerOption {
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	if g.firstCall <= 0 {
		return grpc.Creds(creds)
	}
	return grpc.Creds(firstCallCreds{TransportCredentials: creds, g: g})
}

// countingListener counts the connections it accepted that are not closed.
type countingListener struct {
	net.Listener
	open *atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.open.Add(1)
	return &countedConn{Conn: c, open: l.open}, nil
}

// countedConn takes itself off the count at its first Close.
type countedConn struct {
	net.Conn
	open *atomic.Int64
	once sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.Conn.Close()
}

// firstCallCreds wraps a connection's credentials: after the handshake,
// the connection gRPC reads is a firstCallConn.
type firstCallCreds struct {
	credentials.TransportCredentials
	g *grpcConns
}

// ServerHandshake runs the wrapped handshake, then arms the first-call
// bound.
func (c firstCallCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return nil, nil, err
	}
	return newFirstCallConn(conn, c.g.firstCall, c.g.noCall), info, nil
}

// Clone returns a copy wrapping a clone of the wrapped credentials.
func (c firstCallCreds) Clone() credentials.TransportCredentials {
	return firstCallCreds{TransportCredentials: c.TransportCredentials.Clone(), g: c.g}
}

// firstCallConn closes itself unless the client starts a call (sends a
// HEADERS frame) within its bound. Until then it follows the client's
// frames (9-byte headers, payloads skipped) in what gRPC reads; after,
// Read passes through. Read has one caller at a time (gRPC's reader).
type firstCallConn struct {
	net.Conn
	timer  *time.Timer
	called bool    // a HEADERS frame was read
	skip   int     // bytes of the preface or of a frame's payload to pass
	hdr    [9]byte // the frame header being read
	got    int     // bytes of hdr read
}

func newFirstCallConn(conn net.Conn, bound time.Duration, noCall prometheus.Counter) *firstCallConn {
	c := &firstCallConn{Conn: conn, skip: http2Preface}
	c.timer = time.AfterFunc(bound, func() {
		noCall.Inc()
		_ = conn.Close()
	})
	return c
}

func (c *firstCallConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if !c.called {
		c.follow(p[:n])
	}
	return n, err
}

// follow reads the frame headers in b until a HEADERS frame, which stops
// the timer.
func (c *firstCallConn) follow(b []byte) {
	for len(b) > 0 {
		if c.skip > 0 {
			k := min(c.skip, len(b))
			c.skip -= k
			b = b[k:]
			continue
		}
		k := copy(c.hdr[c.got:], b)
		c.got += k
		b = b[k:]
		if c.got < len(c.hdr) {
			return
		}
		c.got = 0
		if c.hdr[3] == http2FrameHeaders {
			c.called = true
			c.timer.Stop()
			return
		}
		c.skip = int(c.hdr[0])<<16 | int(c.hdr[1])<<8 | int(c.hdr[2])
	}
}

// Close stops the timer: a connection closed otherwise is not counted.
func (c *firstCallConn) Close() error {
	c.timer.Stop()
	return c.Conn.Close()
}

// Server-side keepalive: a connection without any frame for
// keepaliveTime is pinged, and closed if the ping is not answered within
// keepaliveTimeout, so connections of vanished clients do not linger.
const (
	keepaliveTime    = time.Minute
	keepaliveTimeout = 20 * time.Second
)

// grpcConnLimits bounds what a connection may hold on the gRPC port: the
// handshake (TLS and HTTP/2 preface), time without calls, and keepalive
// pings (clients pinging faster than --grpc-keepalive-min-time get GOAWAY).
// None of them touches a call in flight.
func grpcConnLimits(st Options) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ConnectionTimeout(st.GRPCHandshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle:     st.GRPCMaxConnIdle,     // 0: never
			MaxConnectionAge:      st.GRPCMaxConnAge,      // 0: never (grpc-go's default)
			MaxConnectionAgeGrace: st.GRPCMaxConnAgeGrace, // 0: no bound
			Time:                  keepaliveTime,
			Timeout:               keepaliveTimeout,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             st.GRPCKeepaliveMinTime,
			PermitWithoutStream: true,
		}),
	}
}

// streamWorkers sizes gRPC's worker pool: callers block on Redis, so it
// needs about as many workers as concurrent calls; beyond the pool, gRPC
// starts a goroutine per call as it would without one.
func streamWorkers() uint32 { return uint32(64 * runtime.GOMAXPROCS(0)) }

// stopGRPC lets in-flight calls finish for up to timeout, then cuts the rest.
func stopGRPC(s *grpc.Server, timeout time.Duration) {
	done := make(chan struct{})
	go func() {
		s.GracefulStop()
		close(done)
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		s.Stop()
		<-done
	}
}
