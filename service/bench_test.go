package service_test

import (
	"context"
	"testing"

	"github.com/sluice-rls/sluice/service"
)

// BenchmarkShouldRateLimit is an Envoy-like request of three descriptors
// (remote_address, user_id, route+user_id) through the handler on memory
// backends, the buckets never running dry. DESIGN.md's goal: < 1 µs and
// ≤ 2 allocations per request. "sharedkeys" hashes global bucket keys with
// SHA-256, as with Redis; "nodekeys" is the memory-only deployment, whose
// keys never leave the process.
func BenchmarkShouldRateLimit(b *testing.B) {
	for _, bc := range []struct {
		name           string
		metrics        bool
		globalInMemory bool
		one            bool // one descriptor (remote_address) instead of three
	}{
		{"sharedkeys/metrics=off", false, false, false},
		{"sharedkeys/metrics=on", true, false, false},
		{"nodekeys/metrics=on", true, true, false},
		{"nodekeys/metrics=on/1descriptor", true, true, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			h := newHarness(b, `
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 4000000000
      local: {unit: second, requests_per_unit: 4000000000}
  - key: user_id
    rate_limit: {unit: second, requests_per_unit: 4000000000}
  - key: route
    value: /api/orders*
    descriptors:
      - key: user_id
        rate_limit: {unit: second, requests_per_unit: 4000000000}
`, func(o *service.Options) {
				if !bc.metrics {
					o.Metrics = nil
				}
				o.GlobalInMemory = bc.globalInMemory
			})
			req := request("edge", desc("remote_address=10.1.2.3"), desc("user_id=alice"), desc("route=/api/orders/42", "user_id=alice"))
			if bc.one {
				req = request("edge", desc("remote_address=10.1.2.3"))
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := h.srv.ShouldRateLimit(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
