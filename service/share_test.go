package service_test

import (
	"context"
	"sync"
	"testing"

	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/service"
)

// shareRecorder is the global layer on memory, recording each hit's Share
// by the hit's limit's requests (one rule each).
type shareRecorder struct {
	sharedMemory
	mu    sync.Mutex
	share map[uint64]uint32
}

func (r *shareRecorder) Hit(ctx context.Context, hits []bucket.Hit, states []bucket.State) (bucket.Decision, error) {
	r.mu.Lock()
	for _, h := range hits {
		r.share[h.Limit.Requests] = h.Share
	}
	r.mu.Unlock()
	return r.sharedMemory.Hit(ctx, hits, states)
}

// Settings.Share is the share of every global rule that sets none and may
// hold one; a rule's own share wins, share: 0 and charges opt out, and
// --quota-mode (every rule a quota) turns it off.
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
		set   func(*service.Settings)
		share map[uint64]uint32 // by requests_per_unit
	}{
		{"--share 0.25", func(s *service.Settings) { s.Share = 0.25 }, map[uint64]uint32{1: 250000, 2: 500000, 3: 0, 4: 0}},
		{"no --share", func(*service.Settings) {}, map[uint64]uint32{1: 0, 2: 500000, 3: 0, 4: 0}},
		{"--quota-mode", func(s *service.Settings) { s.Share, s.QuotaMode = 0.25, true }, map[uint64]uint32{1: 0, 3: 0, 4: 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &shareRecorder{share: map[uint64]uint32{}}
			h := newHarness(t, rules, func(o *service.Options) {
				rec.sharedMemory = o.Global.(sharedMemory)
				o.Global = rec
				tc.set(&o.Settings)
			})
			for _, k := range []string{"unset", "own", "off", "postpaid"} {
				h.call(t, request("d", desc(k+"=v")))
			}
			for rpu, want := range tc.share {
				if got := rec.share[rpu]; got != want {
					t.Errorf("rule of %d/second: Share %d, want %d", rpu, got, want)
				}
			}
		})
	}
}
