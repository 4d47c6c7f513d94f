package service

import (
	"fmt"
	"unicode/utf8"

	"google.golang.org/grpc/encoding"
	protoenc "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Codec is the gRPC codec of the rate-limit server: gRPC's protobuf codec,
// except for requests whose string fields carry invalid UTF-8.
//
// Envoy copies header values into descriptor values byte for byte, and HTTP
// allows bytes that are not UTF-8; Envoy's protobuf library sends them as
// they are, but Go's refuses such a message. Without this codec a client
// that sends one such header would get every request of it answered with an
// error, which Envoy (failure_mode_deny: false) lets through unlimited. The
// codec instead decodes the request with each invalid byte written as the
// four characters \xNN, so the value stays distinct and is limited.
// protobuf-go has no option to skip the check; hence this walk of the wire
// format, which runs only after the normal decoding failed.
type Codec struct {
	proto   encoding.CodecV2
	metrics *Metrics
}

// Codec returns the server's gRPC codec, counting the requests it repairs
// in ratelimit_malformed_parts_total{kind="invalid_utf8"}. Install it with
// grpc.ForceServerCodecV2.
func (s *Server) Codec() *Codec {
	return &Codec{proto: encoding.GetCodecV2(protoenc.Name), metrics: s.opts.Metrics}
}

// Name returns "proto": the codec replaces gRPC's for the same content type.
func (c *Codec) Name() string { return protoenc.Name }

// Marshal encodes v with gRPC's protobuf codec.
func (c *Codec) Marshal(v any) (mem.BufferSlice, error) { return c.proto.Marshal(v) }

// Unmarshal decodes data into v, escaping invalid UTF-8 in string fields
// when the plain decoding fails.
func (c *Codec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.proto.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return err
	}
	fixed, changed := escapeInvalidUTF8(data.Materialize(), m.ProtoReflect().Descriptor())
	if !changed {
		return err
	}
	proto.Reset(m)
	if err := proto.Unmarshal(fixed, m); err != nil {
		return fmt.Errorf("decoding the request with invalid UTF-8 escaped: %w", err)
	}
	c.metrics.malformed(malformedUTF8)
	return nil
}

// escapeInvalidUTF8 returns the wire-format message b of type md with the
// invalid UTF-8 of every string field, nested ones included, escaped, and
// whether anything changed. Malformed wire data is left to the decoder.
func escapeInvalidUTF8(b []byte, md protoreflect.MessageDescriptor) ([]byte, bool) {
	out := make([]byte, 0, len(b)+16)
	changed := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, false
		}
		field := b[:n+m]
		b = b[n+m:]
		fd := md.Fields().ByNumber(num)
		if typ != protowire.BytesType || fd == nil {
			out = append(out, field...)
			continue
		}
		v, _ := protowire.ConsumeBytes(field[n:])
		switch {
		case fd.Kind() == protoreflect.StringKind && !utf8.Valid(v):
			out = protowire.AppendTag(out, num, typ)
			out = protowire.AppendString(out, escapeBytes(v))
			changed = true
			continue
		case fd.Kind() == protoreflect.MessageKind:
			if inner, ok := escapeInvalidUTF8(v, fd.Message()); ok {
				out = protowire.AppendTag(out, num, typ)
				out = protowire.AppendBytes(out, inner)
				changed = true
				continue
			}
		}
		out = append(out, field...)
	}
	return out, changed
}

// escapeBytes writes each byte of v that is not part of valid UTF-8 as \xNN.
func escapeBytes(v []byte) string {
	const hexDigits = "0123456789abcdef"
	out := make([]byte, 0, len(v)+8)
	for len(v) > 0 {
		r, size := utf8.DecodeRune(v)
		if r == utf8.RuneError && size == 1 {
			out = append(out, '\\', 'x', hexDigits[v[0]>>4], hexDigits[v[0]&0xf])
		} else {
			out = append(out, v[:size]...)
		}
		v = v[size:]
	}
	return string(out)
}
