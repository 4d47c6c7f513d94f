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
	} {
		_, err := render(t, tc.vals)
		if err == nil || !strings.Contains(err.Error(), "schema") || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%q: err = %v, want a schema error naming %q", tc.vals, err, tc.msg)
		}
	}
}
