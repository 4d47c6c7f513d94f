package charttest

import (
	"strings"
	"testing"
)

// TestSchemaRejects: values.schema.json refuses unknown keys (a typo would
// otherwise be ignored silently) and wrong types, naming the key; the values
// of every value set pass it (TestValueSets).
func TestSchemaRejects(t *testing.T) {
	for _, tc := range []struct{ vals, msg string }{
		{"rules: {examples: true}\nautoscalling: {enabled: false}", "autoscalling"},
		{"rules: {examples: true}\nmetrics: {serviceMonitor: {enable: true}}", "enable"},
		{"rules: {examples: true}\nreplicaCount: three", "replicaCount"},
		{"rules: {examples: 'yes'}", "examples"},
		{"rules: {examples: true}\nextraEnv: {RLS_LOG_LEVEL: debug}", "extraEnv"},
		{"rules: {examples: true}\nextraArgs: --shadow", "extraArgs"},
		{"rules: {examples: true}\nprobes: {type: tcp}", "probes"},
		{"rules: {examples: true}\nadaptive: {configMap: mine}", "configMap"},
		{"rules: {examples: true}\nadaptive: {config: {prometheus: 'http://p', polices: []}}", "polices"},
		{"rules: {examples: true}\nadaptive: {config: {prometheus: 'http://p', policies: [{name: a, domain: d, min_scale: low}]}}", "min_scale"},
		{"rules: {examples: true}\nadaptive: {config: {prometheus: 'http://p', policies: [{name: a, domain: d, interval: 15}]}}", "interval"},
		{"rules: {examples: true}\nadaptive: {config: {prometheus: 'http://p', policies: [{name: a, domain: d, signals: [{name: s, query: q, lower_above: 1, raise_below: 0.5, rise: 1}]}]}}", "rise"},
		{"rules: {examples: true}\nadaptive: {config: {prometheus: 'http://p', policies: [{name: a, domain: d, proportional: {query: q}}]}}", "baseline"},
		{"rules: {examples: true}\nglobalLayer: {consistency: Leased}", "consistency"},
		{"rules: {examples: true}\nglobalLayer: {consistency: lease}", "consistency"},
		{"rules: {examples: true}\nglobalLayer: {share: 1}", "share"},
		{"rules: {examples: true}\nglobalLayer: {share: -0.1}", "share"},
		{"rules: {examples: true}\nglobalLayer: {share: '1'}", "share"},
		{"rules: {examples: true}\nglobalLayer: {share: half}", "share"},
		{"rules: {examples: true}\nglobalLayer: {share: true}", "share"},
		{"rules: {examples: true}\nglobalLayer: {leasePeriod: '2'}", "leasePeriod"},
		{"rules: {examples: true}\nglobalLayer: {leasePeriod: 0s}", "leasePeriod"},
		{"rules: {examples: true}\nglobalLayer: {leasePeriod: -1s}", "leasePeriod"},
		{"rules: {examples: true}\nglobalLayer: {leasePeriod: 2 s}", "leasePeriod"},
		{"rules: {examples: true}\nglobalLayer: {leasePeriod: 2sec}", "leasePeriod"},
		{"rules: {examples: true}\nglobalLayer: {leasePeriod: 0.1ns}", "leasePeriod"},
		{"rules: {examples: true}\nglobalLayer: {leasePeriod: 2}", "leasePeriod"},
		{"rules: {examples: true}\nglobalLayer: {leasePeriod: 9999999h}", "leasePeriod"},
		{"rules: {examples: true}\nglobalLayer: {leasePeriod: 1s, sharing: 0.5}", "sharing"},
	} {
		_, err := render(t, tc.vals)
		if err == nil || !strings.Contains(err.Error(), "schema") || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%q: err = %v, want a schema error naming %q", tc.vals, err, tc.msg)
		}
	}
}
