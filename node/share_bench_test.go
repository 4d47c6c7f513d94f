package node

import (
	"context"
	"log/slog"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rls/sluice/backend/lease"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/internal/cputime"
	"github.com/sluice-rls/sluice/internal/redistest"
	"github.com/sluice-rls/sluice/ruleset"
	"github.com/sluice-rls/sluice/service"
)

// shareBenchRules are the Envoy-like mix's rules, limits far above any
// load, each global rule with a share of half its limit.
const shareBenchRules = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 4000000000
      share: 0.5
      local: {unit: second, requests_per_unit: 4000000000}
  - key: user_id
    rate_limit: {unit: second, requests_per_unit: 4000000000, share: 0.5}
  - key: route
    value: /api/orders*
    descriptors:
      - key: user_id
        rate_limit: {unit: second, requests_per_unit: 4000000000, share: 0.5}
`

// BenchmarkShareDecision is the Envoy-like request of three descriptors
// (remote_address, user_id, route+user_id) through the handler, on the
// layers a node builds (newBackends): "memory", the memory global layer
// of a node without Redis; "memory-sharedkeys", the same layer keyed with
// SHA-256 as Redis' keys are (bucket.SumKey), which is what keys cost the
// share path; and "share", every rule leased with share 0.5 in front of a
// real redis-server, once the share is granted, so that no decision calls
// Redis (redis-calls/op says so). cpu-ns/op is the process' CPU time, the
// node's background work included. Compare the cases within one run; on a
// busy machine, alternate runs of the binaries compared (docs/benchmarks.md).
func BenchmarkShareDecision(b *testing.B) {
	for _, bc := range []struct {
		name              string
		redis, sharedKeys bool
	}{{"memory", false, false}, {"memory-sharedkeys", false, true}, {"share", true, true}} {
		b.Run(bc.name, func(b *testing.B) {
			st := testOptions()
			st.Logger = slog.New(slog.DiscardHandler)
			if bc.redis {
				st.Redis, st.RedisTimeout = "redis://"+redistest.Start(b).Addr()+"/0", time.Second
				st.Consistency = lease.Leased
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			reg := prometheus.NewRegistry()
			layers, err := newBackends(ctx, st, ruleset.NewStore(nil), st.Logger, reg, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer layers.global.close()
			global := layers.global.limiter
			if bc.sharedKeys && !bc.redis {
				global = sharedKeys{global}
			}
			f, err := descriptors.Parse("rules.yaml", []byte(shareBenchRules))
			if err != nil {
				b.Fatal(err)
			}
			rules, err := descriptors.New([]*descriptors.File{f}, st.Rules.descriptorOptions())
			if err != nil {
				b.Fatal(err)
			}
			srv := service.New(service.Options{
				Rules:    ruleset.NewStore(rules),
				Local:    layers.local,
				Global:   global,
				Logger:   st.Logger,
				Metrics:  service.NewMetrics(reg),
				GrayKey:  st.GrayKey,
				Settings: st.Settings,
			})
			req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{
				benchDescriptor("remote_address", "10.1.2.3"),
				benchDescriptor("user_id", "alice"),
				benchDescriptor("route", "/api/orders/42", "user_id", "alice"),
			}}
			decide := func() {
				resp, err := srv.ShouldRateLimit(ctx, req)
				if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					b.Fatalf("%v, %v", resp.GetOverallCode(), err)
				}
			}
			byRedis := func() float64 { return gathered(b, reg, "ratelimit_share_decisions_total", "redis") }
			if bc.redis {
				// Until the registry admits this node, every hit goes to Redis'
				// part; the cells, empty when granted, refill 2·10⁹ tokens a second.
				deadline := time.Now().Add(10 * time.Second)
				for gathered(b, reg, "ratelimit_share_decisions_total", "share") < 100 {
					if time.Now().After(deadline) {
						b.Fatal("no decision by the share 10 s after the start")
					}
					decide()
					time.Sleep(time.Millisecond)
				}
			}
			redis0 := byRedis()
			b.ReportAllocs()
			cpu0 := cputime.Process()
			for b.Loop() {
				decide()
			}
			cputime.ReportPerOp(b, cpu0)
			b.ReportMetric((byRedis()-redis0)/float64(b.N), "redis-calls/op")
		})
	}
}

// sharedKeys is a global layer that reports its keys shared, as Redis
// does, so that the server hashes them with SHA-256.
type sharedKeys struct{ bucket.Limiter }

func (sharedKeys) Shared() bool { return true }

func benchDescriptor(pairs ...string) *commonv3.RateLimitDescriptor {
	d := &commonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(pairs); i += 2 {
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: pairs[i], Value: pairs[i+1]})
	}
	return d
}

// gathered returns the value of the counter name whose one label has
// value (0 when absent).
func gathered(b *testing.B, reg *prometheus.Registry, name, value string) float64 {
	b.Helper()
	fams, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == value {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
