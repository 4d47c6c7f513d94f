package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-rls/sluice/internal/logtest"
	"github.com/sluice-rls/sluice/node"
)

// inProcess is one `rls serve` run in the test's own process: the node
// its flags describe, run until Stop; Log holds what it writes to stdout
// and stderr.
type inProcess struct {
	t       *testing.T
	Log     *logtest.Buffer
	node    *node.Node // nil when the flags were refused
	cancel  context.CancelFunc
	done    chan error
	stopped bool
}

// stopWithin bounds how long serve may take to return after its context
// is cancelled.
const stopWithin = 15 * time.Second

// loopback returns the flags most of these tests serve with: gRPC and HTTP
// on free loopback ports, no admin listener, JSON logs (which servingLine
// reads), then extra.
func loopback(extra ...string) []string {
	return append([]string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", "", "--log-format", "json"}, extra...)
}

// serveInProcess runs `rls serve args...` with getenv as its environment
// until Stop, or the test's end.
func serveInProcess(t *testing.T, getenv func(string) string, args ...string) *inProcess {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &inProcess{t: t, Log: &logtest.Buffer{}, cancel: cancel, done: make(chan error, 1)}
	n, err := newNode(ctx, args, s.Log, getenv)
	if n == nil || err != nil {
		s.done <- err
	} else {
		s.node = n
		go func() { s.done <- n.Run(ctx) }()
	}
	t.Cleanup(func() {
		if s.stopped {
			return
		}
		cancel()
		select {
		case <-s.done:
		case <-time.After(stopWithin):
			t.Errorf("serve did not stop after cancel")
		}
	})
	return s
}

// Serving waits for serve's "serving" log line and returns it.
func (s *inProcess) Serving() map[string]any {
	s.t.Helper()
	return servingLine(s.t, s.Log)
}

// Addr waits until the node serves and returns its gRPC address.
func (s *inProcess) Addr() string {
	s.t.Helper()
	if s.node != nil {
		select {
		case <-s.node.Ready():
			return s.node.Addrs().GRPC.String()
		case err := <-s.done:
			s.done <- err // for Stop
		case <-time.After(10 * time.Second):
		}
	}
	s.t.Fatalf("not serving:\n%s", s.Log.String())
	return ""
}

// Client dials Addr in plaintext; the connection closes at the test's end.
func (s *inProcess) Client() rlsv3.RateLimitServiceClient {
	s.t.Helper()
	conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { _ = conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

// Stop cancels serve's context and returns what serve returned; serve not
// returning within stopWithin fails the test.
func (s *inProcess) Stop() error {
	s.t.Helper()
	s.cancel()
	select {
	case err := <-s.done:
		s.stopped = true
		return err
	case <-time.After(stopWithin):
		s.stopped = true // the cleanup would only wait again
		s.t.Fatal("serve did not stop after cancel")
		return nil
	}
}

// StopCleanly is Stop, failing the test unless serve returned nil.
func (s *inProcess) StopCleanly() {
	s.t.Helper()
	if err := s.Stop(); err != nil {
		s.t.Errorf("serve returned %v after cancel, want nil", err)
	}
}

// servingLine waits for serve's "serving" log line and returns it.
func servingLine(t *testing.T, log *logtest.Buffer) map[string]any {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, line := range strings.Split(log.String(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "serving" {
				return m
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no serving line:\n%s", log.String())
	return nil
}

// edgeRequest is a request of one descriptor of one entry, key=value, in
// the example rules' domain "edge".
func edgeRequest(key, value string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{{
		Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: key, Value: value}},
	}}}
}
