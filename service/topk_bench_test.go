package service_test

import (
	"context"
	"fmt"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/jonboulle/clockwork"

	"github.com/sluice-rls/sluice/internal/cputime"
	"github.com/sluice-rls/sluice/service"
)

// BenchmarkRefusedTopK is the refusal path (a rule that refuses every
// request) with the top-K of refused values off and on (32 counters), for
// one value refused again and again, and for values cycling through 1 000
// and 100 000 distinct ones (with 100 000 nearly every refusal replaces
// the smallest counter). Metrics are on, refusal details and logging off
// (as rls serve --refusal-details=false --log-refusals 0), so that the
// sketch's share shows.
func BenchmarkRefusedTopK(b *testing.B) {
	for _, top := range []int{0, service.DefaultTopRefused} {
		for _, distinct := range []int{1, 1000, 100_000} {
			b.Run(fmt.Sprintf("top=%d/values=%d", top, distinct), func(b *testing.B) {
				h := newHarnessOn(b, clockwork.NewFakeClockAt(harnessStart), `
domain: edge
descriptors:
  - key: user_id
    rate_limit: {unit: second, requests_per_unit: 0}
`, func(o *service.Options) {
					o.TopRefused = top
					o.NoRefusalDetails = true
				})
				reqs := make([]*rlsv3.RateLimitRequest, distinct)
				for i := range reqs {
					reqs[i] = request("edge", desc(fmt.Sprintf("user_id=user-%d", i)))
				}
				ctx := context.Background()
				b.ReportAllocs()
				i := 0
				cpu0 := cputime.Process()
				for b.Loop() {
					resp, err := h.srv.ShouldRateLimit(ctx, reqs[i])
					if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
						b.Fatal(resp, err)
					}
					if i++; i == distinct {
						i = 0
					}
				}
				cputime.ReportPerOp(b, cpu0)
			})
		}
	}
}

// BenchmarkAllowedTopK is an allowed request with the top-K on, as rls
// serve runs by default: the same as without it (the sketch is fed on the
// refusal path only).
func BenchmarkAllowedTopK(b *testing.B) {
	for _, top := range []int{0, service.DefaultTopRefused} {
		b.Run(fmt.Sprintf("top=%d", top), func(b *testing.B) {
			h := newHarnessOn(b, clockwork.NewFakeClockAt(harnessStart), `
domain: edge
descriptors:
  - key: user_id
    rate_limit: {unit: second, requests_per_unit: 4000000000}
`, func(o *service.Options) { o.TopRefused = top })
			req := request("edge", desc("user_id=alice"))
			ctx := context.Background()
			b.ReportAllocs()
			cpu0 := cputime.Process()
			for b.Loop() {
				if _, err := h.srv.ShouldRateLimit(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
			cputime.ReportPerOp(b, cpu0)
		})
	}
}
