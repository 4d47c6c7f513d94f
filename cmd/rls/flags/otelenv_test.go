package flags_test

import (
	"io"
	"strings"
	"testing"

	"github.com/sluice-rls/sluice/cmd/rls/flags"
)

// TestOTelEnv: OpenTelemetry's standard variables set the tracing flags
// that neither the command line nor RLS_* set (on main they were
// ignored: OTEL_EXPORTER_OTLP_ENDPOINT alone traced nothing).
func TestOTelEnv(t *testing.T) {
	for _, tc := range []struct {
		name          string
		env           map[string]string
		args          []string
		endpoint      string
		protocol      string
		ratio         float64
		wantErrSubstr string
	}{
		{"base endpoint, OpenTelemetry's default protocol", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, nil,
			"http://collector:4318/v1/traces", "http/protobuf", 0.01, ""},
		{"base endpoint with a path", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector:4318/otlp/", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, nil,
			"https://collector:4318/otlp/v1/traces", "http/protobuf", 0.01, ""},
		{"grpc", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, nil,
			"http://collector:4317", "grpc", 0.01, ""},
		{"traces endpoint as it is, traces protocol first", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/custom", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://other:1",
			"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, nil,
			"http://c:4318/custom", "http/protobuf", 0.01, ""},
		{"the flag wins", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, []string{"--tracing-endpoint", "otel:4317"},
			"otel:4317", "grpc", 0.01, ""},
		{"RLS_ wins", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "RLS_TRACING_ENDPOINT": "otel:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, nil,
			"otel:4317", "grpc", 0.01, ""},
		{"sampler", map[string]string{"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}, nil, "", "grpc", 0.25, ""},
		{"sampler on", map[string]string{"OTEL_TRACES_SAMPLER": "parentbased_always_on"}, nil, "", "grpc", 1, ""},
		{"sampler, the flag wins", map[string]string{"OTEL_TRACES_SAMPLER": "parentbased_always_on"}, []string{"--tracing-sample-ratio", "0.5"}, "", "grpc", 0.5, ""},
		{"exporter none", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_TRACES_EXPORTER": "none"}, nil, "", "grpc", 0.01, ""},
		{"SDK disabled", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SDK_DISABLED": "true"}, nil, "", "grpc", 0.01, ""},
		{"sampler not parent-based", map[string]string{"OTEL_TRACES_SAMPLER": "always_on"}, nil, "", "", 0, "use parentbased_always_on"},
		{"sampler unknown", map[string]string{"OTEL_TRACES_SAMPLER": "jaeger_remote"}, nil, "", "", 0, "OTEL_TRACES_SAMPLER"},
		{"sampler arg out of range", map[string]string{"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, nil, "", "", 0, "OTEL_TRACES_SAMPLER_ARG"},
		{"exporter zipkin", map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, nil, "", "", 0, "OTLP only"},
		{"protocol unknown", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, nil, "", "", 0, "--tracing-protocol \"http/json\""},
		{"base endpoint not a URL", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, nil, "", "", 0, "want a URL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := flags.ParseServe(tc.args, envOf(tc.env), io.Discard)
			if tc.wantErrSubstr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErrSubstr) {
					t.Fatalf("ParseServe = %v, want an error with %q", err, tc.wantErrSubstr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.TracingEndpoint != tc.endpoint || s.TracingProtocol != tc.protocol || s.TracingSampleRatio != tc.ratio {
				t.Errorf("endpoint %q, protocol %q, ratio %v; want %q, %q, %v", s.TracingEndpoint, s.TracingProtocol, s.TracingSampleRatio, tc.endpoint, tc.protocol, tc.ratio)
			}
		})
	}
}
