//go:build integration

package integration

import (
	"context"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// TestMalformedValuesAreLimited sends what a client controls through Envoy —
// descriptor values — at their worst: too long, and not UTF-8. Each request
// also carries the example rules' blocked address, so an answer other than
// OVER_LIMIT (an error included: Envoy lets it through) is a bypass.
func TestMalformedValuesAreLimited(t *testing.T) {
	p := startRLS(t)
	long := strings.Repeat("x", 1100) // over --max-value-bytes (1024)
	resp, err := p.Client.ShouldRateLimit(context.Background(), request("edge", "remote_address=50.0.0.5", "user_id="+long))
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("long user_id: %v, %v; want OVER_LIMIT", resp.GetOverallCode(), err)
	}

	var raw rlsv3.RateLimitResponse
	err = p.Conn.Invoke(context.Background(), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
		rawRequest("edge", [2]string{"remote_address", "50.0.0.5"}, [2]string{"user_id", "\xff\xfe"}), &raw,
		grpc.ForceCodecV2(rawCodec{encoding.GetCodecV2(protoenc.Name)}))
	if err != nil || raw.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("user_id not UTF-8: %v, %v; want OVER_LIMIT", raw.GetOverallCode(), err)
	}

	_, metrics := p.HTTPGet(t, "/metrics")
	for _, want := range []string{
		`ratelimit_malformed_parts_total{kind="long_value"} 1`,
		`ratelimit_malformed_parts_total{kind="invalid_utf8"} 1`,
		`ratelimit_invalid_requests_total 0`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

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
