package tracing

import (
	"fmt"
	"net/url"
	"strings"

	"go.opentelemetry.io/otel/attribute"
)

// Resource is resource attributes written as OTEL_RESOURCE_ATTRIBUTES is:
// key=value pairs separated by commas, values percent-encoded where they
// hold a comma, an equals sign or a space
// ("service.name=edge,service.namespace=gateway"). Its text form is
// --tracing-resource's. It parses the text itself because OpenTelemetry's
// SDK parses that form only from the environment (resource.WithFromEnv),
// not from a flag's value.
type Resource []attribute.KeyValue

// UnmarshalText implements encoding.TextUnmarshaler.
func (r *Resource) UnmarshalText(b []byte) error {
	var kvs Resource
	for pair := range strings.SplitSeq(string(b), ",") {
		if strings.TrimSpace(pair) == "" {
			continue
		}
		k, v, ok := strings.Cut(pair, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return fmt.Errorf("resource attribute %q: want key=value", pair)
		}
		value, err := url.PathUnescape(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("resource attribute %s: %w", k, err)
		}
		kvs = append(kvs, attribute.String(k, value))
	}
	*r = kvs
	return nil
}

// MarshalText implements encoding.TextMarshaler, percent-encoding what
// would break a pair.
func (r Resource) MarshalText() ([]byte, error) {
	pairs := make([]string, 0, len(r))
	for _, kv := range r {
		pairs = append(pairs, string(kv.Key)+"="+url.PathEscape(kv.Value.Emit()))
	}
	return []byte(strings.Join(pairs, ",")), nil
}
