package node

import (
	"context"
	"net"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-rls/sluice/service"
	"github.com/sluice-rls/sluice/xds"
)

// healthServiceName is the grpc.health.v1 service name envoyproxy/ratelimit
// reports, so that health checks written for it keep working.
const healthServiceName = "ratelimit"

// grpcServer serves the gRPC listener: RateLimitService v3 and
// grpc.health.v1, within the connection limits.
type grpcServer struct {
	srv    *grpc.Server
	conns  *grpcConns
	health *health.Server
}

// newGRPCServer builds the gRPC server of svc over tls (nil: plaintext).
// With xDS (xsrc not nil) health says NOT_SERVING until the first update
// (gateHealth).
func newGRPCServer(ctx context.Context, st Options, svc *service.Server, tls *serverTLS, traced bool, xsrc *xds.Source, reg prometheus.Registerer) *grpcServer {
	// Stream workers are reused goroutines whose stacks have already grown
	// to what a decision with a Redis call needs; a fresh goroutine per
	// call spent ~9% of the CPU growing its stack (profiled under load).
	// svc.Codec decodes values that are not UTF-8 instead of refusing them.
	conns := newGRPCConns(st.GRPCMaxConns, st.GRPCFirstCallTimeout, reg)
	opts := []grpc.ServerOption{conns.serverOption(transportCredentials(tls)), grpc.NumStreamWorkers(streamWorkers()), grpc.ForceServerCodecV2(svc.Codec())}
	opts = append(opts, grpcConnLimits(st)...)
	if traced {
		// Envoy's trace context read from the call's header, not from a copy.
		opts = append(opts, grpc.InTapHandle(svc.TapHandle))
	}
	srv := grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(srv, svc)
	hs := health.NewServer()
	// The overall status ("") and, as envoyproxy/ratelimit reports it, the
	// service "ratelimit"; drain turns both NOT_SERVING.
	hs.SetServingStatus(healthServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	if xsrc != nil {
		gateHealth(ctx, hs, xsrc)
	}
	return &grpcServer{srv: srv, conns: conns, health: hs}
}

// serve serves on lis, counted and capped, until the server stops.
func (g *grpcServer) serve(lis net.Listener) error {
	return g.srv.Serve(g.conns.listener(lis))
}
