package main

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
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
