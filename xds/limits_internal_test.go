package xds

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-rls/sluice/descriptors"
)

// nested is a RateLimitConfig whose descriptors nest levels deep, with a
// rule at the bottom.
func nested(name string, levels int) *rlsconfv3.RateLimitConfig {
	cfg := &rlsconfv3.RateLimitConfig{Name: name, Domain: name}
	next := &cfg.Descriptors
	for i := range levels {
		d := &rlsconfv3.RateLimitDescriptor{Key: fmt.Sprintf("k%d", i)}
		if i == levels-1 {
			d.RateLimit = &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 1}
		}
		*next = append(*next, d)
		next = &d.Descriptors
	}
	return cfg
}

// wide is a RateLimitConfig with n descriptors side by side.
func wide(name string, n int) *rlsconfv3.RateLimitConfig {
	cfg := &rlsconfv3.RateLimitConfig{Name: name, Domain: name}
	for i := range n {
		cfg.Descriptors = append(cfg.Descriptors, &rlsconfv3.RateLimitDescriptor{Key: "k", Value: fmt.Sprintf("v%d", i),
			RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 1}})
	}
	return cfg
}

// TestLimits: each limit admits an update at it and refuses one over it,
// naming the limit's flag, before anything is rendered (the refusal says
// which limit, not what parsing found).
func TestLimits(t *testing.T) {
	lim := Limits{MaxBytes: 4096, MaxResources: 3, MaxDescriptors: 10, MaxDepth: 4}.withDefaults()
	tests := []struct {
		name string
		cfgs []*rlsconfv3.RateLimitConfig
		want string // "": accepted
	}{
		{"depth at the limit", []*rlsconfv3.RateLimitConfig{nested("a", 4)}, ""},
		{"depth over", []*rlsconfv3.RateLimitConfig{nested("a", 5)}, "xds:a (42 bytes): descriptors nested more than 4 levels deep (--xds-max-depth)"},
		{"far too deep for the decoder", []*rlsconfv3.RateLimitConfig{nested("far", 200)}, "(xds:far, "},
		{"resources at the limit", []*rlsconfv3.RateLimitConfig{wide("a", 1), wide("b", 1), wide("c", 1)}, ""},
		{"resources over", []*rlsconfv3.RateLimitConfig{wide("a", 1), wide("b", 1), wide("c", 1), wide("d", 1)}, "update holds 4 resources, more than the 3 allowed (--xds-max-resources)"},
		{"descriptors at the limit", []*rlsconfv3.RateLimitConfig{wide("a", 5), wide("b", 5)}, ""},
		{"descriptors over", []*rlsconfv3.RateLimitConfig{wide("a", 5), wide("b", 6)}, "xds:b"},
		{"bytes over", []*rlsconfv3.RateLimitConfig{wide("a", 1), {Name: "big", Domain: strings.Repeat("d", 5000)}}, "more than the 4096 allowed (--max-rule-bytes)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := anyOf(t, tt.cfgs...)
			_, err := convert(res, lim, descriptors.Options{}, nil)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
			var ref *refusal
			if !errors.As(err, &ref) || ref.first == nil {
				t.Fatalf("error %T, want a *refusal", err)
			}
		})
	}
	if err := fmt.Sprint(convert(anyOf(t, wide("a", 5), wide("b", 6)), lim, descriptors.Options{}, nil)); !strings.Contains(err, "more than 10 descriptors (--xds-max-descriptors)") {
		t.Errorf("descriptors over: %s", err)
	}
}

// TestRenderBudget: a resource under every limit is built without being
// rendered, however deep; one that is refused is rendered for its errors'
// positions, and when its rendering as a rule file would pass
// renderFactor times MaxBytes it is refused while rendering, without the
// rendering growing past that.
func TestRenderBudget(t *testing.T) {
	cfg := nested("deepish", 30) // each level indents every line below it
	res := anyOf(t, cfg)
	size := len(res[0].GetValue())
	lim := Limits{MaxBytes: int64(size) + 8, MaxDepth: 30}.withDefaults()
	if _, err := convert(res, lim, descriptors.Options{}, nil); err != nil {
		t.Fatalf("a valid deep resource: %v; want it built, not rendered", err)
	}
	bad := nested("deepish", 30)
	leaf := bad.Descriptors[0]
	for len(leaf.Descriptors) > 0 {
		leaf = leaf.Descriptors[0]
	}
	leaf.Key = "" // refused: a rule with an empty key, at the bottom
	res = anyOf(t, bad)
	_, err := convert(res, lim, descriptors.Options{}, nil)
	if err == nil || !strings.Contains(err.Error(), "renders as more than") {
		t.Fatalf("error %v, want the render budget", err)
	}
	lim.MaxBytes = 1 << 20
	_, err = convert(res, lim, descriptors.Options{}, nil)
	if err == nil || !regexp.MustCompile(`xds:deepish:\d+:\d+: descriptor key is required`).MatchString(err.Error()) {
		t.Fatalf("with room to render: %v; want the empty key, with its position", err)
	}
}

// TestRefusalIsBounded: an update of many bad resources describes the
// first maxRefused and counts the rest; the first error is the first
// resource's.
func TestRefusalIsBounded(t *testing.T) {
	var cfgs []*rlsconfv3.RateLimitConfig
	for i := range 50 {
		cfgs = append(cfgs, &rlsconfv3.RateLimitConfig{Name: fmt.Sprintf("bad%02d", i)}) // no domain
	}
	_, err := convert(anyOf(t, cfgs...), Limits{}.withDefaults(), descriptors.Options{}, nil)
	var ref *refusal
	if !errors.As(err, &ref) {
		t.Fatalf("error %v, want a *refusal", err)
	}
	if len(ref.all) != maxRefused || ref.more != 50-maxRefused || ref.resource != "xds:bad00" || !strings.Contains(ref.first.Error(), "xds:bad00") {
		t.Errorf("refusal: %d described, %d more, first %s: %v", len(ref.all), ref.more, ref.resource, ref.first)
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("… and %d more resources refused", 50-maxRefused)) {
		t.Errorf("error lacks the count of the rest: %.300s", err)
	}
}

// TestLongNamesAreCut: a resource's name in errors is cut to maxNameBytes.
func TestLongNamesAreCut(t *testing.T) {
	long := strings.Repeat("n", 10000)
	_, err := convert(anyOf(t, &rlsconfv3.RateLimitConfig{Name: long}), Limits{}.withDefaults(), descriptors.Options{}, nil)
	if err == nil || len(err.Error()) > 1000 {
		t.Errorf("error of %d bytes, want a short one", len(fmt.Sprint(err)))
	}
}

// TestFingerprint: an update with the same resources as the rules in use
// builds nothing, whatever its version; one differing in any field, or in
// a resource's name or order, has another fingerprint and is built.
func TestFingerprint(t *testing.T) {
	cfgs := []*rlsconfv3.RateLimitConfig{wide("a", 2), {Domain: "unnamed", Descriptors: wide("x", 1).Descriptors}}
	fpOf := func(cfgs ...*rlsconfv3.RateLimitConfig) [sha256.Size]byte {
		t.Helper()
		conv, err := convert(anyOf(t, cfgs...), Limits{}.withDefaults(), descriptors.Options{}, nil)
		if err != nil || conv.cfg == nil {
			t.Fatalf("convert: %v", err)
		}
		return conv.fp
	}
	same := fpOf(cfgs...)
	again, err := convert(anyOf(t, cfgs...), Limits{}.withDefaults(), descriptors.Options{}, &same)
	if err != nil || again.cfg != nil || again.fp != same {
		t.Errorf("the same update again: cfg %v, err %v; want nothing built", again.cfg, err)
	}
	other := [sha256.Size]byte{1}
	if c, _ := convert(anyOf(t, cfgs...), Limits{}.withDefaults(), descriptors.Options{}, &other); c.cfg == nil {
		t.Error("an update differing from the rules in use built nothing")
	}
	changed := proto.Clone(cfgs[0]).(*rlsconfv3.RateLimitConfig)
	changed.Descriptors[1].RateLimit.RequestsPerUnit++
	renamed := proto.Clone(cfgs[0]).(*rlsconfv3.RateLimitConfig)
	renamed.Name = "b"
	for name, fp := range map[string][sha256.Size]byte{
		"a limit changed":    fpOf(changed, cfgs[1]),
		"a resource renamed": fpOf(renamed, cfgs[1]),
		"resources swapped":  fpOf(cfgs[1], cfgs[0]),
	} {
		if fp == same {
			t.Errorf("%s: the same fingerprint", name)
		}
	}
}

// TestRefusalOfTheSetNamesItsResource: a problem only the whole set shows
// (a domain defined twice) names the resource and its size too.
func TestRefusalOfTheSetNamesItsResource(t *testing.T) {
	res := anyOf(t, wide("a", 1), &rlsconfv3.RateLimitConfig{Name: "b", Domain: "a"})
	_, err := convert(res, Limits{}.withDefaults(), descriptors.Options{}, nil)
	var ref *refusal
	if !errors.As(err, &ref) || ref.resource != "xds:b" || ref.bytes != len(res[1].GetValue()) || !strings.Contains(ref.first.Error(), `duplicate domain "a"`) {
		t.Fatalf("refusal %+v, want xds:b, its %d bytes and the duplicate domain", ref, len(res[1].GetValue()))
	}
}
