package main

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-rls/sluice/internal/logtest"
)

func TestUnixPath(t *testing.T) {
	tests := []struct {
		addr    string
		want    string
		unix    bool
		wantErr string
	}{
		{addr: ":8081"},
		{addr: "127.0.0.1:0"},
		{addr: "unix:rls.sock", want: "rls.sock", unix: true},
		{addr: "unix:/run/rls.sock", want: "/run/rls.sock", unix: true},
		{addr: "unix:///run/rls.sock", want: "/run/rls.sock", unix: true},
		{addr: "unix://host/run/rls.sock", unix: true, wantErr: "unix:///absolute/path"},
		{addr: "unix:", unix: true, wantErr: "empty socket path"},
	}
	for _, tt := range tests {
		got, unix, err := unixPath(tt.addr)
		if got != tt.want || unix != tt.unix || (err == nil) != (tt.wantErr == "") || err != nil && !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("unixPath(%q) = %q, %v, %v; want %q, %v, error %q", tt.addr, got, unix, err, tt.want, tt.unix, tt.wantErr)
		}
	}
}

// TestListenUnixLeftovers: a socket left by a dead process is replaced; a
// regular file and a socket another process serves on are kept and
// refused.
func TestListenUnixLeftovers(t *testing.T) {
	dir := t.TempDir()

	regular := filepath.Join(dir, "file.sock")
	if err := os.WriteFile(regular, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	if lis, err := listen("unix:" + regular); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("listen on a regular file: %v, want a 'not a socket' error", err)
		if lis != nil {
			lis.Close()
		}
	}
	if b, err := os.ReadFile(regular); err != nil || string(b) != "keep me" {
		t.Errorf("regular file after listen: %q, %v; want it untouched", b, err)
	}

	live := filepath.Join(dir, "live.sock")
	other, err := net.Listen("unix", live)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if lis, err := listen("unix:" + live); err == nil || !strings.Contains(err.Error(), "another process") {
		t.Errorf("listen on a served socket: %v, want an 'another process' error", err)
		if lis != nil {
			lis.Close()
		}
	}

	stale := filepath.Join(dir, "stale.sock")
	dead, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	dead.SetUnlinkOnClose(false) // as after a crash: the file stays
	dead.Close()
	lis, err := listen("unix://" + stale)
	if err != nil {
		t.Fatalf("listen over a stale socket: %v", err)
	}
	st, err := os.Stat(stale)
	if err != nil || st.Mode().Perm() != socketMode || st.Mode().Type() != fs.ModeSocket {
		t.Errorf("socket file: %v, %v; want a socket with mode %v", st.Mode(), err, socketMode)
	}
	lis.Close()
	if _, err := os.Lstat(stale); !os.IsNotExist(err) {
		t.Errorf("socket file after Close: %v, want it removed", err)
	}
}

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
