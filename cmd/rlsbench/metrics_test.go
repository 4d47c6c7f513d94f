package main

import (
	"strings"
	"testing"
)

func TestParseMetrics(t *testing.T) {
	text := `# HELP ratelimit_fallback_active 1 while in fallback.
# TYPE ratelimit_fallback_active gauge
ratelimit_fallback_active 1
ratelimit_fallback_transitions_total{to="fallback"} 4
ratelimit_fallback_transitions_total{to="redis"} 3
ratelimit_decisions_total{domain="edge",layer="global",result="ok",rule="edge.remote_address"} 7
`
	got, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if want := (metricsSample{transitions: 4, active: 1, seen: true}); got != want {
		t.Errorf("parseMetrics = %+v, want %+v", got, want)
	}
	none, err := parseMetrics(strings.NewReader("go_goroutines 12\n"))
	if err != nil || none.seen {
		t.Errorf("parseMetrics without fallback series = %+v, %v; want not seen", none, err)
	}
}
