package node

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestEmbeddedRulesGauge(t *testing.T) {
	for _, embedded := range []bool{true, false} {
		reg := prometheus.NewRegistry()
		registerEmbeddedRules(reg, embedded)
		want := 0.0
		if embedded {
			want = 1
		}
		mfs, err := reg.Gather()
		if err != nil || len(mfs) != 1 || mfs[0].GetName() != "ratelimit_config_embedded" {
			t.Fatalf("gathered %v, %v", mfs, err)
		}
		if got := mfs[0].GetMetric()[0].GetGauge().GetValue(); got != want {
			t.Errorf("embedded %v: gauge %v, want %v", embedded, got, want)
		}
	}
}
