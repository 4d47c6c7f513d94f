package main

import (
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-rls/sluice/cmd/rls/flags"
	"github.com/sluice-rls/sluice/node"
)

// TestPeerEnvGRPCUDSListens: envoyproxy/ratelimit's GRPC_UDS becomes a
// --grpc-addr that listen opens as a unix socket at that path (GRPC_PORT
// unused, as by the peer).
func TestPeerEnvGRPCUDSListens(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ratelimit.sock")
	env := map[string]string{"GRPC_UDS": path, "GRPC_PORT": "9001"}
	s, err := flags.ParseServe(nil, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := node.Listen(s.GRPCAddr)
	if err != nil {
		t.Fatalf("Listen(%q): %v", s.GRPCAddr, err)
	}
	defer lis.Close()
	if lis.Addr().Network() != "unix" || lis.Addr().String() != path {
		t.Errorf("--grpc-addr %q listens on %s %s, want unix %s", s.GRPCAddr, lis.Addr().Network(), lis.Addr(), path)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Type() != fs.ModeSocket {
		t.Errorf("%s: %v, %v; want a socket", path, fi, err)
	}
}
