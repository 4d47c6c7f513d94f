package tracing_test

import (
	"slices"
	"testing"

	"go.opentelemetry.io/otel/attribute"

	"github.com/sluice-rls/sluice/internal/otlptest"
	"github.com/sluice-rls/sluice/tracing"
)

func TestResourceText(t *testing.T) {
	var kvs tracing.Resource
	if err := kvs.UnmarshalText([]byte(" service.name=envoy-ratelimit, service.namespace=a%2Cb%3Dc ,,k=")); err != nil {
		t.Fatal(err)
	}
	want := tracing.Resource{attribute.String("service.name", "envoy-ratelimit"), attribute.String("service.namespace", "a,b=c"), attribute.String("k", "")}
	if !slices.Equal(kvs, want) {
		t.Errorf("read %v, want %v", kvs, want)
	}
	text, _ := want.MarshalText()
	var back tracing.Resource
	if err := back.UnmarshalText(text); err != nil || !slices.Equal(back, want) {
		t.Errorf("%q read back as %v, %v; want %v", text, back, err, want)
	}
	for _, bad := range []string{"service.name", "=x", "k=%zz"} {
		if err := back.UnmarshalText([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestResourceWinsOverEnvironment: Options.Resource (--tracing-resource,
// where envoyproxy/ratelimit's TRACING_SERVICE_* variables go) names the
// spans' service over OTEL_SERVICE_NAME.
func TestResourceWinsOverEnvironment(t *testing.T) {
	t.Setenv("OTEL_SERVICE_NAME", "from-env")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "team=edge")
	col := otlptest.Start(t)
	exportOne(t, tracing.Options{
		Endpoint: col.Addr(), Insecure: true, SampleRatio: 1,
		Resource: tracing.Resource{attribute.String("service.name", "envoy-ratelimit"), attribute.String("service.instance.id", "pod-0")},
	}, col, map[string]string{"service.name": "envoy-ratelimit", "service.instance.id": "pod-0", "team": "edge"})
}
