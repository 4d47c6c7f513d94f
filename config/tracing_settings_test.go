package config_test

import (
	"io"
	"testing"

	"github.com/sluice-rls/sluice/config"
)

func TestTracingFlags(t *testing.T) {
	st, err := config.ParseServe(nil, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if st.TracingEndpoint != "" || st.TracingSampleRatio != 0.01 || st.TracingInsecure {
		t.Errorf("tracing defaults: endpoint %q ratio %v insecure %v; want off, 0.01, false", st.TracingEndpoint, st.TracingSampleRatio, st.TracingInsecure)
	}
	env := map[string]string{"RLS_TRACING_ENDPOINT": "otel:4317", "RLS_TRACING_INSECURE": "true"}
	st, err = config.ParseServe([]string{"--tracing-sample-ratio", "0.5"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if st.TracingEndpoint != "otel:4317" || st.TracingSampleRatio != 0.5 || !st.TracingInsecure {
		t.Errorf("tracing flags: %q %v %v", st.TracingEndpoint, st.TracingSampleRatio, st.TracingInsecure)
	}
	for _, bad := range []string{"-0.5", "1.01", "NaN"} {
		if _, err := config.ParseServe([]string{"--tracing-sample-ratio", bad}, func(string) string { return "" }, io.Discard); err == nil {
			t.Errorf("--tracing-sample-ratio %s accepted", bad)
		}
	}
}
