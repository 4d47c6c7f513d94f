package xds

import (
	"fmt"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/sluice-rls/sluice/ruleset"
)

// Defaults of Limits (and of the --xds-max-* flags). They admit far more
// than real rule sets hold (Envoy Gateway nests a level per match of a
// rule; hundreds of domains, thousands of descriptors) and keep what one
// update can cost small: see docs/operations.md.
const (
	DefaultMaxResources   = 10_000  // RateLimitConfig resources (one domain each) per update
	DefaultMaxDescriptors = 100_000 // descriptors per update, every level of every resource
	DefaultMaxDepth       = 32      // nested descriptor levels (rule files allow 64)
)

// renderFactor bounds the rule files an update renders as, all together:
// at most renderFactor times Limits.MaxBytes. Nesting indents every line
// of the rendering, so a deep resource renders to many times its wire
// size; real rule sets render to about twice it.
const renderFactor = 4

// Limits bound one update. They are checked on the update as received —
// the wire size of every resource, then each decoded resource's nesting
// and descriptor count — before any of it is rendered as a rule file,
// parsed or logged, so that a hostile update is refused (NACK) for about
// the cost of reading it once. Zero fields take the defaults.
type Limits struct {
	// MaxBytes caps the resources' bytes on the wire, all together; 0:
	// ruleset.DefaultMaxRuleBytes (--max-rule-bytes, which also caps the
	// gRPC message).
	MaxBytes       int64
	MaxResources   int // 0: DefaultMaxResources
	MaxDescriptors int // 0: DefaultMaxDescriptors
	MaxDepth       int // 0: DefaultMaxDepth
}

func (l Limits) withDefaults() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = ruleset.DefaultMaxRuleBytes
	}
	if l.MaxResources <= 0 {
		l.MaxResources = DefaultMaxResources
	}
	if l.MaxDescriptors <= 0 {
		l.MaxDescriptors = DefaultMaxDescriptors
	}
	if l.MaxDepth <= 0 {
		l.MaxDepth = DefaultMaxDepth
	}
	return l
}

// checkUpdate checks what can be checked before decoding anything: the
// number of resources and their bytes on the wire.
func (l Limits) checkUpdate(resources []*anypb.Any) error {
	if len(resources) > l.MaxResources {
		return fmt.Errorf("update holds %d resources, more than the %d allowed (--xds-max-resources)", len(resources), l.MaxResources)
	}
	var total int64
	for _, r := range resources {
		total += int64(len(r.GetValue()))
	}
	if total > l.MaxBytes {
		return fmt.Errorf("update holds %d bytes of resources, more than the %d allowed (--max-rule-bytes)", total, l.MaxBytes)
	}
	return nil
}

// recursionLimit is the protobuf decoding depth that admits MaxDepth
// descriptor levels (a RateLimitConfig, then a message per level, then a
// policy and its replaces) and a little more, so that checkTree, not the
// decoder, reports a resource a few levels too deep. Deeper ones stop
// the decoder at once, before it builds them.
func (l Limits) recursionLimit() int { return l.MaxDepth + 8 }

// treeCounter counts the descriptors of one update across its resources.
type treeCounter struct {
	lim         Limits
	descriptors int
}

// check walks one decoded resource: its nesting and its share of the
// update's descriptors. It stops at the first limit crossed, without
// walking further.
func (c *treeCounter) check(cfg *rlsconfv3.RateLimitConfig) error {
	return c.walk(cfg.GetDescriptors(), 1)
}

func (c *treeCounter) walk(ds []*rlsconfv3.RateLimitDescriptor, depth int) error {
	if len(ds) == 0 {
		return nil
	}
	if depth > c.lim.MaxDepth {
		return fmt.Errorf("descriptors nested more than %d levels deep (--xds-max-depth)", c.lim.MaxDepth)
	}
	c.descriptors += len(ds)
	if c.descriptors > c.lim.MaxDescriptors {
		return fmt.Errorf("update holds more than %d descriptors (--xds-max-descriptors)", c.lim.MaxDescriptors)
	}
	for _, d := range ds {
		if err := c.walk(d.GetDescriptors(), depth+1); err != nil {
			return err
		}
	}
	return nil
}

// peekName reads the name (field 1) of an encoded RateLimitConfig that
// did not decode, without decoding the rest: "" when there is none.
func peekName(b []byte) string {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		if num == 1 && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return ""
			}
			return string(v)
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return ""
		}
		b = b[n:]
	}
	return ""
}
