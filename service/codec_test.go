package service_test

import (
	"context"
	"net"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// rawCodec sends []byte as it is, as Envoy's protobuf library sends strings
// that are not UTF-8, and decodes answers with gRPC's protobuf codec.
type rawCodec struct{ proto encoding.CodecV2 }

func (rawCodec) Name() string { return protoenc.Name }

func (c rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := v.([]byte); ok {
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return c.proto.Marshal(v)
}

func (c rawCodec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }

// rawRequest encodes a RateLimitRequest of one-entry descriptors by hand,
// so values may hold any bytes.
func rawRequest(domain string, pairs ...[2]string) []byte {
	var b []byte
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendString(b, domain)
	for _, p := range pairs {
		var e, d []byte
		e = protowire.AppendTag(e, 1, protowire.BytesType)
		e = protowire.AppendString(e, p[0])
		e = protowire.AppendTag(e, 2, protowire.BytesType)
		e = protowire.AppendString(e, p[1])
		d = protowire.AppendTag(d, 1, protowire.BytesType)
		d = protowire.AppendBytes(d, e)
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, d)
	}
	return b
}

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
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{encoding.GetCodecV2(protoenc.Name)})))
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
		err := conn.Invoke(context.Background(), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
			rawRequest("edge", [2]string{"remote_address", "9.9.9.9"}, [2]string{"user_id", value}), &resp)
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
	err := conn.Invoke(context.Background(), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
		rawRequest("edge", [2]string{"user_id", "\xff"}), &resp)
	if err == nil {
		t.Fatal("gRPC's protobuf codec accepted invalid UTF-8; the Codec may no longer be needed")
	}
}
