package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-rls/sluice/internal/logtest"
)

// TestServeOverUnixSockets runs serve with its gRPC and HTTP listeners on
// unix sockets: a ShouldRateLimit call and /healthcheck go through, and the
// socket files are gone once serve returns.
func TestServeOverUnixSockets(t *testing.T) {
	dir := t.TempDir()
	grpcSock, httpSock := filepath.Join(dir, "grpc.sock"), filepath.Join(dir, "http.sock")
	rls := serveInProcess(t, noEnv, "--grpc-addr", "unix:"+grpcSock, "--http-addr", "unix://"+httpSock, "--admin-addr", "", "--log-format", "json")
	if got := rls.Addr(); got != grpcSock {
		t.Errorf("serving line grpc_addr = %q, want %q", got, grpcSock)
	}
	conn, err := grpc.NewClient("unix:"+grpcSock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// The example rules limit remote_address 50.0.0.5 globally to 0.
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), edgeRequest("remote_address", "50.0.0.5"))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("ShouldRateLimit over %s: %v, %v; want OVER_LIMIT", grpcSock, resp.GetOverallCode(), err)
	}
	// rls check reaches it too (grpc-go takes the unix: address as is).
	var out logtest.Buffer
	if err := run(context.Background(), []string{"check", "--addr", "unix:" + grpcSock, "remote_address=50.0.0.5"}, &out, &out, noEnv); !errors.Is(err, errOverLimit) {
		t.Errorf("rls check --addr unix:%s: %v, want OVER_LIMIT\n%s", grpcSock, err, out.String())
	}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", httpSock)
	}}}
	defer hc.CloseIdleConnections()
	if r, err := hc.Get("http://rls/healthcheck"); err != nil || r.StatusCode != http.StatusOK {
		t.Errorf("/healthcheck over %s: %v, %v; want 200", httpSock, r, err)
	} else {
		r.Body.Close()
	}
	rls.StopCleanly()
	for _, p := range []string{grpcSock, httpSock} {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s after shutdown: %v, want it removed", p, err)
		}
	}
}
