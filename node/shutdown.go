package node

import (
	"context"
	"net/http"
	"time"
)

// drain stops s gracefully: /healthcheck answers 503 and gRPC health
// NOT_SERVING, so that Envoy and the kubelet stop sending; calls in
// flight finish within timeout (then the rest are cut); the HTTP servers
// finish their requests within timeout too.
func (s servers) drain(timeout time.Duration) {
	s.draining.Store(true)
	s.grpc.health.Shutdown()
	stopGRPC(s.grpc.srv, timeout)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_ = s.http.Shutdown(ctx)
	for _, srv := range []*http.Server{s.admin, s.metrics} {
		if srv != nil {
			_ = srv.Shutdown(ctx)
		}
	}
}
