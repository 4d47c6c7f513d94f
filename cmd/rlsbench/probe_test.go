package main

import (
	"testing"
	"time"
)

func TestProbesFill(t *testing.T) {
	p := &probes{
		pid: 1, redis: nil, metrics: "http://x/metrics",
		cpu0: time.Second, cpu1: 3 * time.Second,
		ms0: metricsSample{transitions: 1, seen: true},
		ms1: metricsSample{transitions: 3, active: 1, seen: true},
	}
	var o output
	if err := p.fill(&o, 1000); err != nil {
		t.Fatal(err)
	}
	if o.ServerCPUMicros == nil || *o.ServerCPUMicros != 2000 {
		t.Errorf("server CPU per request = %v µs, want 2000", o.ServerCPUMicros)
	}
	if o.FallbackTransitions == nil || *o.FallbackTransitions != 2 || !o.FallbackActive {
		t.Errorf("fallbacks = %v, active %v; want 2, active", o.FallbackTransitions, o.FallbackActive)
	}
	if o.RedisCommands != nil {
		t.Errorf("Redis commands sampled without -redis: %v", *o.RedisCommands)
	}
}
