package service_test

import (
	"context"
	"net"
	"runtime/metrics"
	"slices"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/jonboulle/clockwork"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/tap"

	"github.com/sluice-rls/sluice/backend/memory"
	"github.com/sluice-rls/sluice/internal/cputime"
	"github.com/sluice-rls/sluice/service"
	"github.com/sluice-rls/sluice/tracing"
)

// benchRules are BenchmarkShouldRateLimit's: the buckets never run dry.
const benchRules = `
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
`

// BenchmarkShouldRateLimit is an Envoy-like request of three descriptors
// (remote_address, user_id, route+user_id) through the handler on memory
// backends, the buckets never running dry. The goal (docs/benchmarks.md): < 1 µs and
// ≤ 2 allocations per request. "sharedkeys" hashes global bucket keys with
// SHA-256, as with Redis; "nodekeys" is the memory-only deployment, whose
// keys never leave the process. BenchmarkTracing has the variants with
// tracing on.
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
			clock := clockwork.NewFakeClockAt(harnessStart)
			h := newHarnessOn(b, clock, benchRules, func(o *service.Options) {
				if !bc.metrics {
					o.Metrics = nil
				}
				if bc.globalInMemory {
					o.Global = memory.New(memory.Options{Clock: clock})
				}
			})
			req := request("edge", desc("remote_address=10.1.2.3"), desc("user_id=alice"), desc("route=/api/orders/42", "user_id=alice"))
			if bc.one {
				req = request("edge", desc("remote_address=10.1.2.3"))
			}
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

// BenchmarkTracing is BenchmarkShouldRateLimit's sharedkeys/metrics=on
// request with tracing off ("off") and on, called with the context a
// gRPC handler gets from Envoy (envoyContext): a tracer provider sampling
// root traces at 1% with no trace context in Envoy's metadata ("0.01"),
// or Envoy's traceparent "unsampled" (flags 00) or "sampled" (01); and at
// ratio 0 or 1 without trace context, what the 1% is made of: every
// request's cost ("0") and a sampled span's ("1"). Sampled spans go to a
// batcher and an exporter that drops them. Compare off and 0.01 in one
// process, alternated: -bench 'Tracing/^(off|0.01)$' -count 20.
func BenchmarkTracing(b *testing.B) {
	const (
		unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
		sampled   = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	)
	for _, bc := range []struct {
		name        string
		ratio       float64 // < 0: tracing off
		traceparent string
	}{
		{"off", -1, ""},
		{"0.01", 0.01, ""},
		{"0.01-unsampled", 0.01, unsampled},
		{"0.01-sampled", 0.01, sampled},
		{"0", 0, ""},
		{"1", 1, ""},
	} {
		b.Run(bc.name, func(b *testing.B) {
			clock := clockwork.NewFakeClockAt(harnessStart)
			h := newHarnessOn(b, clock, benchRules, func(o *service.Options) {
				if bc.ratio >= 0 {
					o.Tracer = benchTracer(b, bc.ratio)
				}
			})
			var tap tap.ServerInHandle // as rls serve: the tap with tracing on
			if bc.ratio >= 0 {
				tap = h.srv.TapHandle
			}
			ctx := envoyContext(b, tap, bc.traceparent)
			req := request("edge", desc("remote_address=10.1.2.3"), desc("user_id=alice"), desc("route=/api/orders/42", "user_id=alice"))
			b.ReportAllocs()
			cpu0, gc0 := cputime.Process(), gcCycles()
			for b.Loop() {
				if _, err := h.srv.ShouldRateLimit(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
			cputime.ReportPerOp(b, cpu0)
			b.ReportMetric(float64(gcCycles()-gc0)*1e6/float64(b.N), "gc/Mop")
		})
	}
}

// BenchmarkTracingCost measures what tracing at ratio 0.01 costs, as a
// ratio of process CPU time to tracing off, in one process: two servers,
// one without tracing and one with, answer BenchmarkTracing's request in
// alternate chunks of 10,000 calls, and each pair of chunks (some 50 ms)
// gives a ratio, so that the load of other processes, which drifts over
// seconds, weighs on both alike. Reported: the median ratio and its
// quartiles over the pairs, and each side's CPU per request. The traced
// server's spans are flushed at the end of its chunks, so the other does
// not carry them on its heap; GC work triggered in one chunk may still
// run in the next (BenchmarkTracing's gc/Mop counts GC cycles apart).
func BenchmarkTracingCost(b *testing.B) {
	for _, bc := range []struct {
		name, traceparent string
		off               bool // both servers without tracing: the method's noise
	}{
		{"0.01", "", false},
		{"0.01-unsampled", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", false},
		{"off-vs-off", "", true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			const chunk = 10000
			clock := clockwork.NewFakeClockAt(harnessStart)
			off := newHarnessOn(b, clock, benchRules)
			p := benchProvider(b, 0.01)
			on := newHarnessOn(b, clock, benchRules, func(o *service.Options) {
				if !bc.off {
					o.Tracer = p.Tracer()
				}
			})
			srvs := [2]*service.Server{off.srv, on.srv}
			var tap tap.ServerInHandle
			if !bc.off {
				tap = on.srv.TapHandle
			}
			ctxs := [2]context.Context{envoyContext(b, nil, bc.traceparent), envoyContext(b, tap, bc.traceparent)}
			req := request("edge", desc("remote_address=10.1.2.3"), desc("user_id=alice"), desc("route=/api/orders/42", "user_id=alice"))
			var (
				cpu     [2]int64 // per side
				calls   [2]int
				last    [2]int64 // the last chunk's CPU per side
				ratios  []float64
				side, i int
			)
			t0 := cputime.Process()
			if t0 == 0 {
				b.Skip("no process CPU time here")
			}
			for b.Loop() {
				if _, err := srvs[side].ShouldRateLimit(ctxs[side], req); err != nil {
					b.Fatal(err)
				}
				if i++; i < chunk {
					continue
				}
				if side == 1 {
					_ = p.ForceFlush(context.Background())
				}
				t := cputime.Process()
				last[side] = t - t0
				cpu[side] += t - t0
				calls[side] += i
				if side == 1 {
					ratios = append(ratios, float64(last[1])/float64(last[0]))
				}
				t0, i, side = t, 0, 1-side
			}
			if len(ratios) == 0 {
				return // a calibration run
			}
			slices.Sort(ratios)
			q := func(f float64) float64 { return ratios[int(f*float64(len(ratios)-1)+0.5)] }
			b.ReportMetric(q(0.5), "ratio")
			b.ReportMetric(q(0.25), "ratio-p25")
			b.ReportMetric(q(0.75), "ratio-p75")
			b.ReportMetric(float64(len(ratios)), "pairs")
			b.ReportMetric(float64(cpu[0])/float64(calls[0]), "off-cpu-ns/op")
			b.ReportMetric(float64(cpu[1])/float64(calls[1]), "on-cpu-ns/op")
		})
	}
}

// gcCycles is the number of GC cycles the process has completed: a
// benchmark reports it per million operations, a measure of GC cost that
// other processes do not disturb.
func gcCycles() uint64 {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// envoyContext is the context a gRPC handler gets for a call with the
// metadata of Envoy's rate-limit client (and traceparent tp, unless
// empty), through tap if not nil: taken from a real call to a server on
// 127.0.0.1, held open until the benchmark ends.
func envoyContext(b *testing.B, tap tap.ServerInHandle, tp string) context.Context {
	b.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	got, release := make(chan context.Context, 1), make(chan struct{})
	var opts []grpc.ServerOption
	if tap != nil {
		opts = append(opts, grpc.InTapHandle(tap))
	}
	gs := grpc.NewServer(opts...)
	rlsv3.RegisterRateLimitServiceServer(gs, holdServer{got: got, release: release})
	served := make(chan struct{})
	go func() { defer close(served); _ = gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	md := metadata.Pairs("x-envoy-internal", "true", "x-forwarded-for", "10.1.2.3", "x-envoy-expected-rq-timeout-ms", "20")
	if tp != "" {
		md.Set("traceparent", tp)
	}
	called := make(chan error, 1)
	go func() {
		_, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(metadata.NewOutgoingContext(context.Background(), md), &rlsv3.RateLimitRequest{})
		called <- err
	}()
	b.Cleanup(func() {
		close(release)
		<-called
		conn.Close()
		gs.Stop()
		<-served
	})
	select {
	case ctx := <-got:
		return ctx
	case err := <-called:
		b.Fatalf("call ended before its context was taken: %v", err)
	}
	return nil
}

// holdServer hands each call's context to got and answers when release is closed.
type holdServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
	got     chan<- context.Context
	release <-chan struct{}
}

func (s holdServer) ShouldRateLimit(ctx context.Context, _ *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	s.got <- ctx
	<-s.release
	return &rlsv3.RateLimitResponse{}, nil
}

// benchTracer is the tracer of `rls serve --tracing-sample-ratio ratio`,
// its spans batched to an exporter that drops them.
func benchTracer(b *testing.B, ratio float64) trace.Tracer {
	return benchProvider(b, ratio).Tracer()
}

func benchProvider(b *testing.B, ratio float64) *tracing.Provider {
	p, err := tracing.New(context.Background(), tracing.Options{Exporter: discardExporter{}, SampleRatio: ratio})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	return p
}

type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }
