package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// noopServer answers every ShouldRateLimit with OK and does nothing else:
// gRPC decodes the request and encodes one shared, pre-built response. Its
// throughput on a machine is the ceiling any rate-limit service reaches
// there through the same gRPC stack.
type noopServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
	ok *rlsv3.RateLimitResponse // read-only: encoding only reads it
}

// ShouldRateLimit answers OK.
func (s *noopServer) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return s.ok, nil
}

// startNoop serves a no-op RateLimitService on listen and returns its
// address and a function that stops it.
func startNoop(listen string) (addr string, stop func(), err error) {
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return "", nil, fmt.Errorf("no-op server: %w", err)
	}
	s := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(s, &noopServer{
		ok: &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK},
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(lis)
	}()
	return lis.Addr().String(), func() { s.Stop(); <-done }, nil
}

// serveNoop runs the no-op server until ctx is done or lifetime has passed,
// logging its address as `rls serve` does (msg=serving grpc_addr=...).
func serveNoop(ctx context.Context, listen string, lifetime time.Duration, log *slog.Logger) error {
	addr, stop, err := startNoop(listen)
	if err != nil {
		return err
	}
	defer stop()
	log.Info("serving", "grpc_addr", addr, "backend", "noop", "lifetime", lifetime)
	t := time.NewTimer(lifetime)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
		log.Info("lifetime over: stopping", "lifetime", lifetime)
	}
	return nil
}
