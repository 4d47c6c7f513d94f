package node

import (
	"context"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
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
		got, unix, err := UnixPath(tt.addr)
		if got != tt.want || unix != tt.unix || (err == nil) != (tt.wantErr == "") || err != nil && !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("UnixPath(%q) = %q, %v, %v; want %q, %v, error %q", tt.addr, got, unix, err, tt.want, tt.unix, tt.wantErr)
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
	if lis, err := Listen("unix:" + regular); err == nil || !strings.Contains(err.Error(), "not a socket") {
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
	if lis, err := Listen("unix:" + live); err == nil || !strings.Contains(err.Error(), "another process") {
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
	lis, err := Listen("unix://" + stale)
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

// TestServeOverUnixSockets runs a node with its gRPC and HTTP listeners on
// unix sockets: a ShouldRateLimit call and /healthcheck go through, and the
// socket files are gone once Run returns.
func TestServeOverUnixSockets(t *testing.T) {
	dir := t.TempDir()
	grpcSock, httpSock := filepath.Join(dir, "grpc.sock"), filepath.Join(dir, "http.sock")
	opts := testOptions()
	opts.GRPCAddr, opts.HTTPAddr = "unix:"+grpcSock, "unix://"+httpSock
	rls := start(t, opts)
	if got := rls.Addrs().GRPC.String(); got != grpcSock {
		t.Errorf("gRPC address %q, want %q", got, grpcSock)
	}
	// The example rules limit remote_address 50.0.0.5 globally to 0.
	resp, err := rlsv3.NewRateLimitServiceClient(dial(t, "unix:"+grpcSock)).ShouldRateLimit(context.Background(), edgeRequest("remote_address", "50.0.0.5"))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("ShouldRateLimit over %s: %v, %v; want OVER_LIMIT", grpcSock, resp.GetOverallCode(), err)
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
