// Package xdstest runs a real xDS management server in-process for tests:
// go-control-plane's server/v3 over its snapshot cache, on a loopback port,
// serving RateLimitConfig resources over ADS and recording every request
// its clients send (ACKs, NACKs and their error details).
package xdstest

import (
	"context"
	"net"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
)

// Wait bounds how long WaitRequest waits.
const Wait = 10 * time.Second

// Server is a running management server.
type Server struct {
	Addr     string // host:port it listens on
	cache    cachev3.SnapshotCache
	grpc     *grpc.Server
	cancel   context.CancelFunc
	done     chan struct{}
	requests chan *discovery.DiscoveryRequest
}

// Start runs a management server on addr ("" or "127.0.0.1:0": a free
// loopback port; an address a stopped Server had: the same port again)
// with grpc server options opts (TLS), and stops it at the end of the test.
func Start(t testing.TB, addr string, opts ...grpc.ServerOption) *Server {
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("xdstest: listen %s: %v", addr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		Addr:     lis.Addr().String(),
		cache:    cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil),
		grpc:     grpc.NewServer(opts...),
		cancel:   cancel,
		done:     make(chan struct{}),
		requests: make(chan *discovery.DiscoveryRequest, 1024),
	}
	callbacks := serverv3.CallbackFuncs{
		StreamRequestFunc: func(_ int64, req *discovery.DiscoveryRequest) error {
			select {
			case s.requests <- req:
			default: // a test reading none of them must not stall the server
			}
			return nil
		},
	}
	discovery.RegisterAggregatedDiscoveryServiceServer(s.grpc, serverv3.NewServer(ctx, s.cache, callbacks))
	go func() {
		defer close(s.done)
		_ = s.grpc.Serve(lis)
	}()
	t.Cleanup(s.Stop)
	return s
}

// Set publishes version of the RateLimitConfig resources cfgs for node.
func (s *Server) Set(t testing.TB, node, version string, cfgs ...*rlsconfv3.RateLimitConfig) {
	t.Helper()
	res := make([]types.Resource, len(cfgs))
	for i, c := range cfgs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		t.Fatalf("xdstest: snapshot %s: %v", version, err)
	}
	if err := s.cache.SetSnapshot(context.Background(), node, snap); err != nil {
		t.Fatalf("xdstest: set snapshot %s: %v", version, err)
	}
}

// Stop stops the server, cutting its streams; a second Stop does nothing.
func (s *Server) Stop() {
	s.grpc.Stop()
	s.cancel()
	<-s.done
}

// WaitRequest returns the first request received (from the start, or
// after the last one WaitRequest returned) that match accepts, failing the
// test after Wait.
func (s *Server) WaitRequest(t testing.TB, match func(*discovery.DiscoveryRequest) bool) *discovery.DiscoveryRequest {
	t.Helper()
	timeout := time.NewTimer(Wait)
	defer timeout.Stop()
	for {
		select {
		case req := <-s.requests:
			if match(req) {
				return req
			}
		case <-timeout.C:
			t.Fatalf("xdstest: no matching request within %v", Wait)
			return nil
		}
	}
}

// ACK matches a request acknowledging version.
func ACK(version string) func(*discovery.DiscoveryRequest) bool {
	return func(r *discovery.DiscoveryRequest) bool {
		return r.GetErrorDetail() == nil && r.GetVersionInfo() == version && r.GetResponseNonce() != ""
	}
}

// NACK matches a request refusing an update (one with an error detail).
func NACK(r *discovery.DiscoveryRequest) bool { return r.GetErrorDetail() != nil }
