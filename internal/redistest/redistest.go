// Package redistest starts real redis-server processes for tests: single
// servers (Start) and Redis Clusters (StartCluster), on free 127.0.0.1 ports,
// in the test's temporary directory, without persistence. Each process
// belongs to the test that started it: t.Cleanup kills it by PID, and on
// Linux the kernel kills it if the test binary dies first.
//
// When redis-server (or redis-cli, for clusters) is not installed, tests
// are skipped with a message, unless the environment sets
// RLS_REQUIRE_REDIS=1 (as CI does): then they fail.
//
// Readiness is polled with a deadline, never waited for with a fixed sleep.
package redistest

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/internal/pkitest"
)

// RequireEnv is the environment variable that turns a missing redis-server
// from a skip into a failure.
const RequireEnv = "RLS_REQUIRE_REDIS"

// startTimeout bounds the wait for a server to answer PING.
const startTimeout = 10 * time.Second

// Option changes how Start runs redis-server.
type Option func(*config)

type config struct {
	args []string
	pick func() (int, error) // chooses each try's port (freePort when nil)
	tls  *tlsServer
	unix bool
}

// tlsServer is how a server started WithTLS serves, and how it is pinged.
type tlsServer struct {
	pki         pkitest.PKI
	authClients bool
}

// WithTLS serves TLS only on the server's port (no plaintext port), with
// p's server certificate. With authClients (Redis' tls-auth-clients yes)
// clients must present a certificate signed by p.CA; without, none is
// asked for. Client does not work on such a server: build a client with a
// TLS configuration trusting p.Roots.
func WithTLS(p pkitest.PKI, authClients bool) Option {
	return func(c *config) { c.tls = &tlsServer{pki: p, authClients: authClients} }
}

// WithUnixSocket also serves on a unix socket, Socket, in the server's
// directory, besides its TCP port.
func WithUnixSocket() Option {
	return func(c *config) { c.unix = true }
}

// WithArgs adds redis-server command-line arguments, such as
// "--requirepass", "secret".
func WithArgs(args ...string) Option {
	return func(c *config) { c.args = append(c.args, args...) }
}

// withPortFrom chooses the port of each try with pick (clusters choose
// ports whose bus port is free too). Between a choice and the server's
// bind, another process may take either port: on a busy machine, where
// other tests start servers too, a cluster node then exits during start,
// and the next try chooses again.
func withPortFrom(pick func() (int, error)) Option {
	return func(c *config) { c.pick = pick }
}

// Server is one redis-server process owned by a test.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	args []string
	tls  *tlsServer
	unix bool

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
}

// Start runs a redis-server on a free 127.0.0.1 port, waits until it answers
// PING and returns it. The server is killed when the test ends.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	bin := lookBinary(t, "redis-server")
	var c config
	for _, o := range opts {
		o(&c)
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir(), args: c.args, tls: c.tls, unix: c.unix}
	t.Cleanup(s.Kill)
	// Between choosing a free port and the server binding it, another
	// process may take it: try a few ports.
	pick := c.pick
	if pick == nil {
		pick = freePort
	}
	var err error
	for range 5 {
		if s.port, err = pick(); err != nil {
			t.Fatalf("redistest: %v", err)
		}
		if err = s.start(); err == nil {
			return s
		}
		// A cluster node that failed to start may have written its
		// configuration, naming the port it could not keep.
		_ = os.Remove(filepath.Join(s.dir, "nodes.conf"))
	}
	t.Fatalf("redistest: %v", err)
	return nil
}

// lookBinary finds name on PATH, or skips (fails under RLS_REQUIRE_REDIS=1).
func lookBinary(t testing.TB, name string) string {
	t.Helper()
	bin, err := exec.LookPath(name)
	if err == nil {
		return bin
	}
	msg := fmt.Sprintf("redistest: %s not found on PATH (install redis-server, e.g. apt-get install redis-server)", name)
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("%s; %s=1 requires it", msg, RequireEnv)
	}
	t.Skip(msg)
	return ""
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// start launches the process and waits until it answers PING.
func (s *Server) start() error {
	args := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--daemonize", "no",
		"--logfile", "redis.log",
	}
	if s.tls != nil {
		p := s.tls.pki
		args = append(args, "--port", "0", "--tls-port", strconv.Itoa(s.port),
			"--tls-cert-file", p.ServerCert, "--tls-key-file", p.ServerKey, "--tls-ca-cert-file", p.CA,
			"--tls-auth-clients", map[bool]string{true: "yes", false: "no"}[s.tls.authClients])
	}
	if s.unix {
		args = append(args, "--unixsocket", s.Socket(), "--unixsocketperm", "700")
	}
	args = append(args, s.args...)
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	if err := waitPing(s.dial, done); err != nil {
		s.Kill()
		return fmt.Errorf("redis-server on port %d: %w; log:\n%s", s.port, err, s.logTail())
	}
	return nil
}

// dial connects to the server's port, over TLS (with the client
// certificate) when it serves TLS.
func (s *Server) dial() (net.Conn, error) {
	d := &net.Dialer{Timeout: 100 * time.Millisecond}
	if s.tls == nil {
		return d.Dial("tcp", s.Addr())
	}
	cfg := &tls.Config{RootCAs: s.tls.pki.Roots, Certificates: []tls.Certificate{s.tls.pki.Client}, ServerName: "127.0.0.1"}
	return (&tls.Dialer{NetDialer: d, Config: cfg}).Dial("tcp", s.Addr())
}

// waitPing polls the server with PING, through dial, until it answers, the
// process exits, or startTimeout passes.
func waitPing(dial func() (net.Conn, error), exited <-chan struct{}) error {
	deadline := time.Now().Add(startTimeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return errors.New("exited during start")
		default:
		}
		if last = ping(dial); last == nil {
			return nil
		}
		select {
		case <-exited:
			return errors.New("exited during start")
		case <-time.After(5 * time.Millisecond): // poll interval
		}
	}
	return fmt.Errorf("no PONG within %v: %v", startTimeout, last)
}

// ping sends an inline PING without a client library.
func ping(dial func() (net.Conn, error)) error {
	c, err := dial()
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	// A server with --requirepass answers -NOAUTH: it is up all the same.
	if !strings.HasPrefix(line, "+PONG") && !strings.HasPrefix(line, "-NOAUTH") {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

func (s *Server) logTail() string {
	b, err := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	if err != nil {
		return "(no log)"
	}
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Addr returns the server's "127.0.0.1:port".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Socket returns the path of the server's unix socket (WithUnixSocket).
func (s *Server) Socket() string { return filepath.Join(s.dir, "redis.sock") }

// Port returns the server's port, which Restart keeps.
func (s *Server) Port() int { return s.port }

// Dir returns the server's working directory.
func (s *Server) Dir() string { return s.dir }

// PID returns the process id of the running server, or 0 after Kill.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Client returns a new go-redis client for the server, closed when the test
// ends.
func (s *Server) Client() *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: s.Addr()})
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// Kill kills the server with SIGKILL (a stalled one too) and waits for it to
// exit. Killing a dead server does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// Stall stops the server with SIGSTOP: connections stay open and nothing is
// answered, like a Redis stuck in a long command or a network black hole.
func (s *Server) Stall() { s.signal(syscall.SIGSTOP) }

// Resume continues a stalled server with SIGCONT.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.t.Helper()
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil {
		s.t.Fatalf("redistest: signal %v: server on port %d is not running", sig, s.port)
	}
	if err := cmd.Process.Signal(sig); err != nil {
		s.t.Fatalf("redistest: signal %v: %v", sig, err)
	}
}

// Restart kills the server if it runs and starts it again on the same port
// and directory (empty, since nothing is persisted, except a cluster node's
// configuration), waiting until it answers PING.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	// The port was ours a moment ago; retry briefly should it linger.
	err := waitFor(context.Background(), startTimeout, func(context.Context) error { return s.start() })
	if err != nil {
		s.t.Fatalf("redistest: restart: %v", err)
	}
}

// waitFor polls cond every 10ms until it returns nil or timeout passes, and
// returns its last error.
func waitFor(ctx context.Context, timeout time.Duration, cond func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-tick.C:
		}
	}
}

func listen(port int) (net.Listener, error) {
	return net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
}
