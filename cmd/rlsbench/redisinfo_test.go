package main

import (
	"strings"
	"testing"
	"time"
)

func TestRedisSampleParse(t *testing.T) {
	info := strings.Join([]string{
		"# Stats", "total_connections_received:5", "total_commands_processed:1200",
		"total_reads_processed:300", "",
		"# Commandstats", "cmdstat_evalsha:calls=250,usec=900,usec_per_call=3.60,rejected_calls=0,failed_calls=0",
		"cmdstat_eval:calls=2,usec=40,usec_per_call=20.00", "cmdstat_hmget:calls=900,usec=100",
		"# CPU", "used_cpu_sys:1.500000", "used_cpu_user:0.250000", "used_cpu_sys_children:9.0",
	}, "\r\n")
	var s redisSample
	if err := s.parse(info); err != nil {
		t.Fatal(err)
	}
	want := redisSample{commands: 1200, scripts: 252, reads: 300, hasReads: true, cpu: 1750 * time.Millisecond}
	if s != want {
		t.Errorf("parse = %+v, want %+v", s, want)
	}
}

func TestDelta(t *testing.T) {
	tests := []struct {
		a, b, own uint64
		want      float64
	}{
		{100, 200, 3, 97},
		{100, 102, 3, 0}, // fewer than our own probes: never negative
		{500, 10, 0, 0},  // Redis restarted
	}
	for _, tt := range tests {
		if got := delta(tt.a, tt.b, tt.own); got != tt.want {
			t.Errorf("delta(%d, %d, %d) = %v, want %v", tt.a, tt.b, tt.own, got, tt.want)
		}
	}
}
