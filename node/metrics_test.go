package node

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rls/sluice/service"
)

func TestRegisterFullRefusals(t *testing.T) {
	reg := prometheus.NewRegistry()
	n := uint64(3)
	registerFullRefusals(reg, "local", func() uint64 { return n })
	registerFullRefusals(reg, "global", func() uint64 { return 0 })
	n = 7 // read at scrape time
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "ratelimit_memory_full_refusals_total" || mf.GetType().String() != "COUNTER" {
			t.Errorf("unexpected metric %s of type %s", mf.GetName(), mf.GetType())
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "backend" {
					got[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	if len(got) != 2 || got["local"] != 7 || got["global"] != 0 {
		t.Errorf("ratelimit_memory_full_refusals_total by backend = %v, want local 7, global 0", got)
	}
}

// TestDecisionHistogramBuckets: local decisions take a few microseconds, so
// the histogram needs buckets below 20 µs to tell them apart, and a bound at
// 10 ms, the threshold of the SluiceSlowDecisions alert.
func TestDecisionHistogramBuckets(t *testing.T) {
	reg := prometheus.NewRegistry()
	service.NewMetrics(reg)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var bounds []float64
	for _, mf := range mfs {
		if mf.GetName() == "ratelimit_request_duration_seconds" {
			for _, b := range mf.GetMetric()[0].GetHistogram().GetBucket() {
				bounds = append(bounds, b.GetUpperBound())
			}
		}
	}
	if len(bounds) == 0 {
		t.Fatal("ratelimit_request_duration_seconds not registered")
	}
	if !slices.IsSorted(bounds) {
		t.Errorf("bounds %v not increasing", bounds)
	}
	var below20us int
	for _, b := range bounds {
		if b < 20e-6 {
			below20us++
		}
	}
	if bounds[0] > 5e-6 || below20us < 2 {
		t.Errorf("bounds %v: want the lowest at 5 µs or less and at least two below 20 µs", bounds)
	}
	if !slices.Contains(bounds, 0.01) || bounds[len(bounds)-1] < 0.05 {
		t.Errorf("bounds %v: want 0.01 (the alert's threshold) and a top bound of at least 50 ms", bounds)
	}
}

func TestRegisterBuildInfo(t *testing.T) {
	reg := prometheus.NewRegistry()
	registerBuildInfo(reg, Build{Version: "v1.2.3", Commit: "0123abcd", GoVersion: "go1.26.8"})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "ratelimit_build_info" || mfs[0].GetType().String() != "GAUGE" || len(mfs[0].GetMetric()) != 1 {
		t.Fatalf("gathered %v, want one ratelimit_build_info gauge", mfs)
	}
	m := mfs[0].GetMetric()[0]
	labels := map[string]string{}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	want := map[string]string{"version": "v1.2.3", "commit": "0123abcd", "goversion": "go1.26.8"}
	if len(labels) != len(want) {
		t.Errorf("labels %v, want %v", labels, want)
	}
	for k, v := range want {
		if labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, labels[k], v)
		}
	}
	if v := m.GetGauge().GetValue(); v != 1 {
		t.Errorf("ratelimit_build_info = %v, want 1", v)
	}
}
