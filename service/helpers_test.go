package service_test

import (
	"context"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rls/sluice/backend/memory"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/ruleset"
	"github.com/sluice-rls/sluice/service"
)

// harness is a Server on memory backends and a fake clock.
type harness struct {
	srv    *service.Server
	clock  *clockwork.FakeClock // shared by the server and its backends
	reg    *prometheus.Registry
	local  *memory.Limiter
	global bucket.Limiter
}

func mustRules(t testing.TB, yamls ...string) *descriptors.Config {
	t.Helper()
	var files []*descriptors.File
	for i, y := range yamls {
		f, err := descriptors.Parse("test"+string(rune('0'+i))+".yaml", []byte(y))
		if err != nil {
			t.Fatalf("parse rules: %v", err)
		}
		files = append(files, f)
	}
	cfg, err := descriptors.New(files, descriptors.Options{})
	if err != nil {
		t.Fatalf("build rules: %v", err)
	}
	return cfg
}

// harnessStart is the instant a harness' fake clock starts at.
var harnessStart = time.Unix(1_700_000_000, 0)

// newHarness serves rules with opts applied on top of the defaults.
func newHarness(t testing.TB, rules string, opts ...func(*service.Options)) *harness {
	t.Helper()
	return newHarnessOn(t, clockwork.NewFakeClockAt(harnessStart), rules, opts...)
}

// newHarnessOn is newHarness on clock, for options that build backends of
// their own on the harness' clock.
func newHarnessOn(t testing.TB, clock *clockwork.FakeClock, rules string, opts ...func(*service.Options)) *harness {
	t.Helper()
	h := &harness{clock: clock, reg: prometheus.NewRegistry()}
	h.local = memory.New(memory.Options{Clock: h.clock})
	h.global = sharedMemory{memory.New(memory.Options{Clock: h.clock})}
	o := service.Options{
		Rules:   ruleset.NewStore(mustRules(t, rules)),
		Local:   h.local,
		Global:  h.global,
		Clock:   h.clock,
		GrayKey: service.DefaultGrayKey,
		Metrics: service.NewMetrics(h.reg),
	}
	for _, f := range opts {
		f(&o)
	}
	h.global = o.Global
	h.srv = service.New(o)
	return h
}

// sharedMemory is a memory limiter that reports its buckets shared, as
// Redis does, so that the server keys them with SHA-256 (bucket.SumKey).
type sharedMemory struct{ *memory.Limiter }

func (sharedMemory) Shared() bool { return true }

// desc builds a descriptor from "key=value" pairs.
func desc(pairs ...string) *commonv3.RateLimitDescriptor {
	d := &commonv3.RateLimitDescriptor{}
	for _, p := range pairs {
		k, v, _ := strings.Cut(p, "=")
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return d
}

func request(domain string, ds ...*commonv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
}

func (h *harness) call(t testing.TB, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := h.srv.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatalf("ShouldRateLimit(%v): %v", req, err)
	}
	if got, want := len(resp.GetStatuses()), len(req.GetDescriptors()); got != want {
		t.Fatalf("ShouldRateLimit returned %d statuses for %d descriptors", got, want)
	}
	return resp
}

// admitted sends req n times at the current fake time and counts OK answers.
func (h *harness) admitted(t testing.TB, n int, req *rlsv3.RateLimitRequest) int {
	t.Helper()
	ok := 0
	for range n {
		if h.call(t, req).GetOverallCode() == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	return ok
}

func headerValue(resp *rlsv3.RateLimitResponse, key string) string {
	for _, h := range resp.GetResponseHeadersToAdd() {
		if strings.EqualFold(h.GetKey(), key) {
			return h.GetValue()
		}
	}
	return ""
}

// decisionValue reads ratelimit_decisions_total for one label set.
func decisionValue(t testing.TB, h *harness, domain, rule, layer, result string) float64 {
	t.Helper()
	return metricValue(t, h, "ratelimit_decisions_total", map[string]string{
		"domain": domain, "rule": rule, "layer": layer, "result": result,
	})
}

// metricValue reads a counter or gauge from the harness registry; 0 when the
// series does not exist.
func metricValue(t testing.TB, h *harness, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := h.reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue metrics
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}
