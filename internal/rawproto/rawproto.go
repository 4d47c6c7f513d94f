// Package rawproto sends RateLimitRequests that Go's protobuf library
// cannot encode — string fields that are not UTF-8, as Envoy's library sends
// them — for tests of how sluice decodes them.
package rawproto

import (
	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// Codec sends a []byte as it is and anything else, and every answer, with
// gRPC's protobuf codec. Use it with grpc.ForceCodecV2 and send Request's
// bytes through grpc.ClientConn.Invoke.
type Codec struct{}

// Name returns "proto".
func (Codec) Name() string { return protoenc.Name }

// Marshal returns a []byte unchanged and encodes anything else as protobuf.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := v.([]byte); ok {
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return encoding.GetCodecV2(protoenc.Name).Marshal(v)
}

// Unmarshal decodes data into v as protobuf.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	return encoding.GetCodecV2(protoenc.Name).Unmarshal(data, v)
}

// Method is the full gRPC method name of ShouldRateLimit.
const Method = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// Request encodes a RateLimitRequest for domain with one single-entry
// descriptor per pair (key, value), byte for byte.
func Request(domain string, pairs ...[2]string) []byte {
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
