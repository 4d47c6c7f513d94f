package main

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/sluice-rls/sluice/internal/logtest"
)

// TestCheckOverUnixSocket: rls check --addr unix:path reaches a node
// serving gRPC on a unix socket (grpc-go takes the unix: address as is).
func TestCheckOverUnixSocket(t *testing.T) {
	grpcSock := filepath.Join(t.TempDir(), "grpc.sock")
	rls := serveInProcess(t, noEnv, loopback("--grpc-addr", "unix:"+grpcSock)...)
	rls.Addr()
	// The example rules limit remote_address 50.0.0.5 globally to 0.
	var out logtest.Buffer
	if err := run(context.Background(), []string{"check", "--addr", "unix:" + grpcSock, "remote_address=50.0.0.5"}, &out, &out, noEnv); !errors.Is(err, errOverLimit) {
		t.Errorf("rls check --addr unix:%s: %v, want OVER_LIMIT\n%s", grpcSock, err, out.String())
	}
	rls.StopCleanly()
}
