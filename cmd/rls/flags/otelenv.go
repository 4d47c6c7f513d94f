package flags

import (
	"flag"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/sluice-rls/sluice/tracing"
)

// applyOTelEnv sets the tracing flags not in given (flags set on the
// command line, by RLS_* or by the peer's variables) from OpenTelemetry's
// standard variables, read through getenv:
//
//   - OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (as it is) or
//     OTEL_EXPORTER_OTLP_ENDPOINT (with /v1/traces added for
//     http/protobuf) → --tracing-endpoint;
//   - OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL →
//     --tracing-protocol; with the endpoint from these variables and no
//     protocol, http/protobuf, OpenTelemetry's default;
//   - OTEL_TRACES_SAMPLER (parentbased_always_on, parentbased_always_off,
//     parentbased_traceidratio with OTEL_TRACES_SAMPLER_ARG) →
//     --tracing-sample-ratio;
//   - OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none: tracing off
//     unless --tracing-endpoint is given.
//
// The resource's variables (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES)
// and the exporter's others (OTEL_EXPORTER_OTLP_HEADERS, _CERTIFICATE,
// _COMPRESSION, _TIMEOUT, _INSECURE, and their _TRACES_ forms) are read by
// OpenTelemetry's SDK itself (package tracing).
func applyOTelEnv(fs *flag.FlagSet, getenv func(string) string, given map[string]bool) error {
	set := func(name, value, from string) error {
		if given[name] || value == "" {
			return nil
		}
		if err := fs.Set(name, value); err != nil {
			return fmt.Errorf("%s=%q: %w", from, value, err)
		}
		return nil
	}
	switch exp := getenv("OTEL_TRACES_EXPORTER"); exp {
	case "", "otlp":
	case "none":
		return nil
	default:
		return fmt.Errorf("OTEL_TRACES_EXPORTER=%q: sluice exports traces over OTLP only (otlp, or none)", exp)
	}
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") {
		return nil
	}
	protoVar, proto := firstSet(getenv, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
	if err := set("tracing-protocol", proto, protoVar); err != nil {
		return err
	}
	if !given["tracing-endpoint"] {
		endpointVar, endpoint := firstSet(getenv, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
		if endpoint != "" && proto == "" && !given["tracing-protocol"] {
			if err := set("tracing-protocol", tracing.ProtocolHTTP, endpointVar+" without OTEL_EXPORTER_OTLP_PROTOCOL"); err != nil {
				return err
			}
		}
		if endpoint != "" && endpointVar == "OTEL_EXPORTER_OTLP_ENDPOINT" && fs.Lookup("tracing-protocol").Value.String() == tracing.ProtocolHTTP {
			u, err := url.Parse(endpoint)
			if err != nil || u.Host == "" {
				return fmt.Errorf("OTEL_EXPORTER_OTLP_ENDPOINT=%q: want a URL such as http://collector:4318", endpoint)
			}
			u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces" // the base URL's signal path
			endpoint = u.String()
		}
		if err := set("tracing-endpoint", endpoint, endpointVar); err != nil {
			return err
		}
	}
	if sampler := getenv("OTEL_TRACES_SAMPLER"); sampler != "" {
		ratio, err := samplerRatio(sampler, getenv("OTEL_TRACES_SAMPLER_ARG"))
		if err != nil {
			return err
		}
		return set("tracing-sample-ratio", strconv.FormatFloat(ratio, 'g', -1, 64), "OTEL_TRACES_SAMPLER")
	}
	return nil
}

// samplerRatio is the root sampling ratio of an OTEL_TRACES_SAMPLER value.
// sluice always follows the caller's sampling decision, so only the
// parent-based samplers are taken.
func samplerRatio(sampler, arg string) (float64, error) {
	switch sampler {
	case "parentbased_always_on":
		return 1, nil
	case "parentbased_always_off":
		return 0, nil
	case "parentbased_traceidratio":
		if arg == "" {
			return 1, nil // OpenTelemetry's default
		}
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || !(r >= 0 && r <= 1) {
			return 0, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG=%q: want a ratio in [0, 1]", arg)
		}
		return r, nil
	case "always_on", "always_off", "traceidratio":
		return 0, fmt.Errorf("OTEL_TRACES_SAMPLER=%s: sluice follows the sampling decision of the caller's traceparent; use parentbased_%s", sampler, sampler)
	}
	return 0, fmt.Errorf("OTEL_TRACES_SAMPLER=%q: want parentbased_always_on, parentbased_always_off or parentbased_traceidratio", sampler)
}

// firstSet returns the first of names that getenv has a value for, and
// the value.
func firstSet(getenv func(string) string, names ...string) (string, string) {
	for _, n := range names {
		if v := getenv(n); v != "" {
			return n, v
		}
	}
	return "", ""
}
