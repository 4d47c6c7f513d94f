package service_test

import (
	"context"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/sluice-rls/sluice/backend/share"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/service"
)

// ruleRecorder is the global layer on memory, recording each hit's Rule
// by the hit's limit's requests (one rule each).
type ruleRecorder struct {
	sharedMemory
	mu   sync.Mutex
	rule map[uint64]any
}

func (r *ruleRecorder) Hit(ctx context.Context, hits []bucket.Hit, states []bucket.State) (bucket.Decision, error) {
	r.mu.Lock()
	for _, h := range hits {
		r.rule[h.Limit.Requests] = h.Rule
	}
	r.mu.Unlock()
	return r.sharedMemory.Hit(ctx, hits, states)
}

// Each global hit carries the rule it comes from, for the layers that read
// its settings (consistency, share), also under Envoy's limit override; a
// hit without a rule (an override that matched none) carries nil, not a
// nil *descriptors.Rule, which a layer's assertion would take for a rule.
func TestHitsCarryRule(t *testing.T) {
	const rules = `domain: d
descriptors:
  - key: leased
    rate_limit: {unit: second, requests_per_unit: 1, consistency: leased, share: 0.5}
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 2}
`
	rec := &ruleRecorder{rule: map[uint64]any{}}
	h := newHarness(t, rules, func(o *service.Options) {
		rec.sharedMemory = o.Global.(sharedMemory)
		o.Global = rec
	})
	overridden := desc("plain=o")
	overridden.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit_SECOND}
	none := desc("none=v")
	none.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 4, Unit: typev3.RateLimitUnit_SECOND}
	h.call(t, request("d", desc("leased=v"), desc("plain=v"), overridden, none))
	for rpu, want := range map[uint64]string{1: "d.leased", 2: "d.plain", 3: "d.plain"} {
		if r, ok := rec.rule[rpu].(*descriptors.Rule); !ok || r == nil || r.Path != want {
			t.Errorf("hit of %d/second: Rule %#v, want rule %s", rpu, rec.rule[rpu], want)
		}
	}
	if r, seen := rec.rule[4]; !seen || r != nil {
		t.Errorf("override without a rule: Rule %#v (seen %v), want nil", r, seen)
	}
}

// oneNode is a membership of one node that holds its share.
type oneNode struct{}

func (oneNode) ShareAt(time.Time) (int, bool) { return 1, true }

// The standing-shares layer's default (--share) is the share of every
// global rule that sets none and may hold one; a rule's own share wins,
// and share: 0 and charges opt out. /usage reports each rule's fraction.
func TestDefaultShare(t *testing.T) {
	const rules = `domain: d
descriptors:
  - key: unset
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: own
    rate_limit: {unit: second, requests_per_unit: 2, share: 0.5}
  - key: off
    rate_limit: {unit: second, requests_per_unit: 3, share: 0}
  - key: postpaid
    postpaid: true
    rate_limit: {unit: second, requests_per_unit: 4}
`
	for _, tc := range []struct {
		name  string
		def   uint32             // share.Options.Default
		share map[string]float64 // UsageShare.Fraction by rule; absent: none
	}{
		{"--share 0.25", 250000, map[string]float64{"unset": 0.25, "own": 0.5}},
		{"no --share", 0, map[string]float64{"own": 0.5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, rules, func(o *service.Options) {
				o.Global = share.New(share.Options{Inner: o.Global, Membership: oneNode{}, Clock: o.Clock, Default: tc.def})
			})
			for _, k := range []string{"unset", "own", "off", "postpaid"} {
				u, err := h.srv.Usage(context.Background(), request("d", desc(k+"=v")))
				if err != nil {
					t.Fatal(err)
				}
				l := u.Descriptors[0].Layers
				want, shared := tc.share[k]
				switch {
				case len(l) != 1:
					t.Errorf("rule %s: layers %+v, want the global one", k, l)
				case !shared && l[0].Share != nil:
					t.Errorf("rule %s: share %+v, want none", k, *l[0].Share)
				case shared && (l[0].Share == nil || l[0].Share.Fraction != want):
					t.Errorf("rule %s: share %+v, want fraction %v", k, l[0].Share, want)
				}
			}
		})
	}
}
