package service_test

import (
	"context"
	"net"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-rls/sluice/internal/rawproto"
)

// serveGRPC serves h's Server with opts on a loopback port and returns a
// connection that sends raw bytes.
func serveGRPC(t *testing.T, h *harness, opts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(s, h.srv)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawproto.Codec{})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func TestInvalidUTF8ValueIsLimited(t *testing.T) {
	h := newHarness(t, malformedRules)
	conn := serveGRPC(t, h, grpc.ForceServerCodecV2(h.srv.Codec()))
	call := func(value string) (*rlsv3.RateLimitResponse, error) {
		var resp rlsv3.RateLimitResponse
		err := conn.Invoke(context.Background(), rawproto.Method,
			rawproto.Request("edge", [2]string{"remote_address", "9.9.9.9"}, [2]string{"user_id", value}), &resp)
		return &resp, err
	}
	admitted := 0
	for range 4 {
		resp, err := call("\xff\xfeeve")
		if err != nil {
			t.Fatalf("request with a value that is not UTF-8: %v", err)
		}
		if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
			admitted++
		}
	}
	if admitted != 2 {
		t.Errorf("admitted %d of 4, want 2 (the address limit)", admitted)
	}
	// Each invalid value keeps a bucket of its own (user_id: 3/minute; the
	// first value's has 1 left, fresh ones 3 as the address refuses).
	for _, v := range []string{"\xfe", "\xfd"} {
		resp, err := call(v)
		if err != nil {
			t.Fatal(err)
		}
		if got := resp.GetStatuses()[1].GetLimitRemaining(); got != 3 {
			t.Errorf("user_id %q: remaining %d, want 3 (a fresh bucket)", v, got)
		}
	}
	if got := metricValue(t, h, "ratelimit_malformed_parts_total", map[string]string{"kind": "invalid_utf8"}); got != 6 {
		t.Errorf("invalid_utf8 count = %v, want 6", got)
	}
}

func TestInvalidUTF8WithoutCodecFails(t *testing.T) {
	// What the codec exists for: gRPC's own codec refuses the request, and
	// Envoy would let it through unlimited.
	h := newHarness(t, malformedRules)
	conn := serveGRPC(t, h)
	var resp rlsv3.RateLimitResponse
	err := conn.Invoke(context.Background(), rawproto.Method,
		rawproto.Request("edge", [2]string{"user_id", "\xff"}), &resp)
	if err == nil {
		t.Fatal("gRPC's protobuf codec accepted invalid UTF-8; the Codec may no longer be needed")
	}
}
