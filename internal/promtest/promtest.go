// Package promtest starts a real Prometheus server (the distribution's
// package) on a free 127.0.0.1 port for tests, scraping targets the test
// serves, every second.
package promtest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// RequireEnv names the variable that turns a missing prometheus binary
// from a skip into a failure (CI sets it).
const RequireEnv = "RLS_REQUIRE_PROMETHEUS"

// ScrapeInterval is how often the server scrapes its targets.
const ScrapeInterval = time.Second

// startTimeout bounds a start: Prometheus replays its write-ahead log on a
// restart, which takes a moment on a busy machine.
const startTimeout = 30 * time.Second

// Server is a running prometheus process.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	port int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Start runs prometheus scraping targets (host:port, plain HTTP, path
// /metrics) every ScrapeInterval, and waits until it is ready. It skips
// the test when prometheus is not on PATH, unless RLS_REQUIRE_PROMETHEUS=1.
// The server is killed when the test ends.
func Start(t testing.TB, targets ...string) *Server {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		msg := "promtest: prometheus not found on PATH (install it: apt-get install prometheus; scripts/ensure-deps.sh does)"
		if os.Getenv(RequireEnv) == "1" {
			t.Fatalf("%s; %s=1 requires it", msg, RequireEnv)
		}
		t.Skip(msg)
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir()}
	quoted := make([]string, len(targets))
	for i, tg := range targets {
		quoted[i] = strconv.Quote(tg)
	}
	conf := fmt.Sprintf("global:\n  scrape_interval: %s\n  scrape_timeout: %s\n  evaluation_interval: %s\nscrape_configs:\n  - job_name: test\n    static_configs:\n      - targets: [%s]\n",
		ScrapeInterval, ScrapeInterval, ScrapeInterval, strings.Join(quoted, ", "))
	if err := os.WriteFile(filepath.Join(s.dir, "prometheus.yml"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Kill)
	for range 5 { // another process may take the free port before prometheus binds it
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("promtest: %v", err)
		}
		s.port = l.Addr().(*net.TCPAddr).Port
		l.Close()
		if err = s.start(); err == nil {
			return s
		}
		t.Logf("promtest: %v", err)
	}
	t.Fatalf("promtest: prometheus did not start")
	return nil
}

// URL is the server's base URL.
func (s *Server) URL() string { return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

func (s *Server) start() error {
	cmd := exec.Command(s.bin,
		"--config.file="+filepath.Join(s.dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(s.dir, "data"),
		"--web.listen-address="+net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)),
		"--log.level=warn")
	log, err := os.OpenFile(filepath.Join(s.dir, "prometheus.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start prometheus: %w", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	deadline := time.Now().Add(startTimeout)
	client := &http.Client{Timeout: 500 * time.Millisecond}
	for time.Now().Before(deadline) {
		select {
		case <-done:
			s.Kill()
			return fmt.Errorf("prometheus on port %d exited during start; log:\n%s", s.port, s.logTail())
		default:
		}
		resp, err := client.Get(s.URL() + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond) // polling a process
	}
	s.Kill()
	return fmt.Errorf("prometheus on port %d not ready within %v; log:\n%s", s.port, startTimeout, s.logTail())
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "prometheus.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Kill kills the server (SIGKILL) and waits for it to exit; killing a dead
// server does nothing.
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

// Restart kills the server if it runs and starts it again on the same port
// and data directory, waiting until it is ready.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	var err error
	for range 10 { // the port was ours a moment ago; retry should it linger
		if err = s.start(); err == nil {
			return
		}
	}
	s.t.Fatalf("promtest: restart: %v", err)
}

// WaitFor polls cond until it returns nil or the deadline (d from now)
// passes, and fails the test with cond's last error then.
func WaitFor(t testing.TB, d time.Duration, cond func(context.Context) error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := cond(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %v", d, err)
		}
		time.Sleep(50 * time.Millisecond) // polling a process
	}
}
