package xds

import (
	"errors"
	"fmt"
	"math"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// The RateLimitDescriptor fields of the upstream proto
// (ratelimit/config/ratelimit/v3/rls_conf.proto) that the published
// go-control-plane ratelimit module (v0.1.0, its only release) lacks: the
// generated type keeps them as unknown fields, so sluice decodes them from
// there with protowire. Drop this file when a release carries them.
const (
	fieldQuotaMode = 7 // bool quota_mode
	fieldMetadata  = 8 // google.protobuf.Struct metadata
)

// maxMetadataDepth is how deep metadata may nest, as in rule files.
const maxMetadataDepth = 64

// metadataRecursion is the protobuf decoding depth that admits
// maxMetadataDepth levels of metadata: a level is a Struct, a map entry
// and a Value.
const metadataRecursion = 3*maxMetadataDepth + 4

// extras are a descriptor's fields decoded from its unknown fields.
type extras struct {
	quotaMode bool
	metadata  map[string]any
}

// extrasOf decodes d's quota_mode and metadata. Any other unknown field,
// or one of these with another wire type, is an error: a field sluice
// does not read refuses the update rather than vanish.
func extrasOf(d *rlsconfv3.RateLimitDescriptor) (extras, error) {
	var (
		x  extras
		st *structpb.Struct
	)
	b := []byte(d.ProtoReflect().GetUnknown())
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return x, protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == fieldQuotaMode && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return x, fmt.Errorf("quota_mode: %w", protowire.ParseError(n))
			}
			x.quotaMode, b = v != 0, b[n:]
		case num == fieldMetadata && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return x, fmt.Errorf("metadata: %w", protowire.ParseError(n))
			}
			b = b[n:]
			if st == nil {
				st = &structpb.Struct{}
			}
			// Merge: a message field given twice is merged, as protobuf does.
			if err := (proto.UnmarshalOptions{Merge: true, RecursionLimit: metadataRecursion}).Unmarshal(v, st); err != nil {
				return x, fmt.Errorf("metadata: %w (metadata nests at most %d levels deep)", err, maxMetadataDepth)
			}
		default:
			return x, fmt.Errorf("field %d (wire type %d) is not a RateLimitDescriptor field sluice reads; refused rather than ignored", num, typ)
		}
	}
	if st != nil {
		m, err := metaStruct(st, 1)
		if err != nil {
			return x, fmt.Errorf("metadata: %w", err)
		}
		x.metadata = m
	}
	return x, nil
}

// metaStruct is s as a rule file's metadata (descriptors.Descriptor's
// Metadata): depth counts the levels, as rule files do.
func metaStruct(s *structpb.Struct, depth int) (map[string]any, error) {
	if depth > maxMetadataDepth {
		return nil, fmt.Errorf("nested more than %d levels deep", maxMetadataDepth)
	}
	m := make(map[string]any, len(s.GetFields()))
	for k, v := range s.GetFields() {
		val, err := metaValue(v, depth+1)
		if err != nil {
			return nil, err
		}
		m[k] = val
	}
	return m, nil
}

// metaValue is v as a rule file's metadata value. A Struct number is a
// double; a whole one (up to 2^53) is an int64, as the same number in a
// rule file is. Non-finite numbers are refused, as in rule files.
func metaValue(v *structpb.Value, depth int) (any, error) {
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return k.StringValue, nil
	case *structpb.Value_BoolValue:
		return k.BoolValue, nil
	case *structpb.Value_NumberValue:
		f := k.NumberValue
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("numbers must be finite, got %v", f)
		}
		if f == math.Trunc(f) && math.Abs(f) <= 1<<53 {
			return int64(f), nil
		}
		return f, nil
	case *structpb.Value_StructValue:
		return metaStruct(k.StructValue, depth)
	case *structpb.Value_ListValue:
		if depth > maxMetadataDepth {
			return nil, fmt.Errorf("nested more than %d levels deep", maxMetadataDepth)
		}
		l := make([]any, 0, len(k.ListValue.GetValues()))
		for _, e := range k.ListValue.GetValues() {
			val, err := metaValue(e, depth+1)
			if err != nil {
				return nil, err
			}
			l = append(l, val)
		}
		return l, nil
	}
	return nil, nil // null, or no kind
}

// errUnknownField is the error of a message with a field sluice does not read.
var errUnknownField = errors.New("has fields sluice does not read (unknown to its RateLimitConfig proto); refused rather than ignored")

// checkFields checks that sluice reads every field of cfg: the
// descriptors' fields decode (extrasOf), and no other message carries an
// unknown field.
func checkFields(cfg *rlsconfv3.RateLimitConfig) error {
	if len(cfg.ProtoReflect().GetUnknown()) > 0 {
		return fmt.Errorf("the RateLimitConfig %w", errUnknownField)
	}
	return checkDescriptorFields(cfg.GetDescriptors(), "")
}

func checkDescriptorFields(ds []*rlsconfv3.RateLimitDescriptor, parent string) error {
	for _, d := range ds {
		path := parent + clip(d.GetKey())
		if d.GetValue() != "" {
			path += "=" + clip(d.GetValue())
		}
		if _, err := extrasOf(d); err != nil {
			return fmt.Errorf("descriptor %s: %w", path, err)
		}
		if rl := d.GetRateLimit(); rl != nil {
			if len(rl.ProtoReflect().GetUnknown()) > 0 {
				return fmt.Errorf("descriptor %s: rate_limit %w", path, errUnknownField)
			}
			for _, r := range rl.GetReplaces() {
				if len(r.ProtoReflect().GetUnknown()) > 0 {
					return fmt.Errorf("descriptor %s: rate_limit replaces %w", path, errUnknownField)
				}
			}
		}
		if err := checkDescriptorFields(d.GetDescriptors(), path+" > "); err != nil {
			return err
		}
	}
	return nil
}
