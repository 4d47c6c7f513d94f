package xds

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/sluice-rls/sluice/audit"
	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/ruleset"
)

// fleetUpdate is an update of n domains, one resource each with two
// rules, as a gateway fleet's: about 155 bytes a resource on the wire.
func fleetUpdate(tb testing.TB, n int) ([]*anypb.Any, int) {
	tb.Helper()
	res := make([]*anypb.Any, n)
	size := 0
	for i := range n {
		a, err := anypb.New(&rlsconfv3.RateLimitConfig{Name: fmt.Sprintf("gw-%06d", i), Domain: fmt.Sprintf("domain-%06d", i),
			Descriptors: []*rlsconfv3.RateLimitDescriptor{
				{Key: "remote_address", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 100}},
				{Key: "header_match", Value: fmt.Sprintf("route-%06d", i), RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 10}},
			}})
		if err != nil {
			tb.Fatal(err)
		}
		res[i], size = a, size+proto.Size(a)
	}
	return res, size
}

// heapPeak samples the bytes of live and not yet collected heap objects
// every millisecond until stop is called, which returns the highest.
func heapPeak() (stop func() uint64) {
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	var peak atomic.Uint64
	read := func() {
		metrics.Read(sample)
		if v := sample[0].Value.Uint64(); v > peak.Load() {
			peak.Store(v)
		}
	}
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				read()
			}
		}
	}()
	return func() uint64 {
		close(done)
		<-finished
		read()
		return peak.Load()
	}
}

// updateBudget is the documented memory budget of an update, as a
// multiple of its size on the wire (docs/production.md, "Rules from
// xDS"): its heap at the highest, garbage included, above what the
// process held before. TestUpdateMemoryIsBounded holds apply to it.
const updateBudget = 25

// allocBudget bounds what applying an update allocates in all, as a
// multiple of its size on the wire (measured: 23.6×; 382× when each
// resource was rendered as YAML and parsed back).
const allocBudget = 30

// measureApply applies res to a new source with an audit log, after a
// forced collection, and returns the heap's peak above what it held
// before (sampled every millisecond: a peak between samples is missed,
// never invented), the bytes allocated meanwhile and what the rules keep.
func measureApply(tb testing.TB, res []*anypb.Any) (peak, allocated, kept uint64) {
	tb.Helper()
	empty, err := descriptors.New(nil, descriptors.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	log := slog.New(slog.NewJSONHandler(io.Discard, nil))
	src, err := New(Options{Server: "127.0.0.1:1", Store: ruleset.NewStore(empty), Log: log, Audit: audit.Log{Logger: log},
		Limits: Limits{MaxBytes: 64 << 20, MaxResources: 1 << 20, MaxDescriptors: 1 << 22}})
	if err != nil {
		tb.Fatal(err)
	}
	runtime.GC()
	var before, after, keptStats runtime.MemStats
	runtime.ReadMemStats(&before)
	stop := heapPeak()
	if err := src.apply(context.Background(), res, "v1"); err != nil {
		tb.Fatal(err)
	}
	top := stop()
	runtime.ReadMemStats(&after)
	runtime.GC()
	runtime.ReadMemStats(&keptStats)
	runtime.KeepAlive(src)
	if src.opts.Store.Rules().Len() != 2*len(res) {
		tb.Fatalf("%d rules applied, want %d", src.opts.Store.Rules().Len(), 2*len(res))
	}
	return top - min(top, before.HeapAlloc), after.TotalAlloc - before.TotalAlloc, keptStats.HeapAlloc - min(keptStats.HeapAlloc, before.HeapAlloc)
}

// TestUpdateMemoryIsBounded: a 20,000-domain update (3.1 MB on the wire)
// is applied within the documented budget: its heap peak at most
// updateBudget times its wire size and its allocations at most
// allocBudget times, measured in this process after a forced collection,
// with the collector's default pacing (GOGC=100).
func TestUpdateMemoryIsBounded(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	res, size := fleetUpdate(t, 20_000)
	peak, allocated, kept := measureApply(t, res)
	x := func(b uint64) float64 { return float64(b) / float64(size) }
	t.Logf("%d bytes on the wire: peak heap %.1f MB (%.1f×), allocated %.1f MB (%.1f×), kept %.1f MB (%.1f×)",
		size, float64(peak)/1e6, x(peak), float64(allocated)/1e6, x(allocated), float64(kept)/1e6, x(kept))
	if x(peak) > updateBudget {
		t.Errorf("peak heap %.1f× the update's wire size, over the documented %d×", x(peak), updateBudget)
	}
	if x(allocated) > allocBudget {
		t.Errorf("allocated %.1f× the update's wire size, over %d×", x(allocated), allocBudget)
	}
}

// BenchmarkLargeUpdate applies a 100,000-domain update (15.5 MB on the
// wire, over the default limits, which the benchmark lifts) to a source
// with an audit log, and reports the heap's peak above what it held
// before, as bytes and as a multiple of the update's wire size
// (peak-x), and what the rules keep once applied (kept-x). XDS_DOMAINS
// changes the size: go test -run X -bench LargeUpdate -benchtime 1x ./xds.
func BenchmarkLargeUpdate(b *testing.B) {
	n := 100_000
	if _, err := fmt.Sscan(getenv("XDS_DOMAINS"), &n); err != nil {
		n = 100_000
	}
	res, size := fleetUpdate(b, n)
	b.ReportAllocs()
	for b.Loop() {
		peak, _, kept := measureApply(b, res)
		b.ReportMetric(float64(size)/1e6, "wire-MB")
		b.ReportMetric(float64(peak)/1e6, "peak-MB")
		b.ReportMetric(float64(peak)/float64(size), "peak-x")
		b.ReportMetric(float64(kept)/float64(size), "kept-x")
	}
}

func getenv(k string) string { return os.Getenv(k) }

// TestRefusedUpdateIsNotBuiltAgain: a refused update sent again (as a
// State of the World server does after each NACK) gets the same refusal
// without being built, rendered and parsed again; another update is.
func TestRefusedUpdateIsNotBuiltAgain(t *testing.T) {
	res, _ := fleetUpdate(t, 500) // a refused build allocates some 57 kB a domain: ample to tell from a lookup
	bad := &rlsconfv3.RateLimitConfig{Name: "bad", Domain: "bad", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 1}}}}
	a, err := anypb.New(bad)
	if err != nil {
		t.Fatal(err)
	}
	res = append(res, a)
	empty, err := descriptors.New(nil, descriptors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	src, err := New(Options{Server: "127.0.0.1:1", Store: ruleset.NewStore(empty), Log: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	applyOnce := func(res []*anypb.Any) (string, uint64) {
		t.Helper()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		err := src.apply(context.Background(), res, "v1")
		runtime.ReadMemStats(&after)
		if err == nil {
			t.Fatal("a bad update applied")
		}
		return err.Error(), after.TotalAlloc - before.TotalAlloc
	}
	first, built := applyOnce(res)
	if !strings.Contains(first, "xds:bad:3:12: descriptor key is required") {
		t.Fatalf("refusal %q, want the empty key with its position", first)
	}
	again, cost := applyOnce(res)
	t.Logf("refused: %d bytes allocated the first time, %d sent again", built, cost)
	if again != first {
		t.Errorf("sent again: %q, want %q", again, first)
	}
	if cost > built/4 {
		t.Errorf("sent again: %d bytes allocated, the first time %d; want it not built again", cost, built)
	}
	if msg, cost := applyOnce(res[1:]); msg != first || cost < built/4 {
		t.Errorf("another update: %q for %d bytes; want it built again (%d bytes the first time) and refused", msg, cost, built)
	}
	if src.opts.Store.Rules().Len() != 0 {
		t.Error("a refused update's rules were swapped in")
	}
}
