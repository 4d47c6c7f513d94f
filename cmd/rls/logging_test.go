package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rls/sluice/cmd/rls/flags"
)

// TestJSONLogDurationsAreText: the JSON handler alone would write
// 10000000 for 10ms.
func TestJSONLogDurationsAreText(t *testing.T) {
	var buf bytes.Buffer
	log := newLogger(slog.LevelInfo, flags.LogJSON, &buf)
	log.Info("draining", "timeout", 10*time.Millisecond, "count", 3,
		slog.Group("redis", "deadline", 1500*time.Microsecond), "backoff", slog.AnyValue(2*time.Second))
	var line struct {
		Timeout any
		Count   any
		Backoff any
		Redis   struct{ Deadline any }
	}
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("%v: %s", err, buf.String())
	}
	if line.Timeout != "10ms" || line.Redis.Deadline != "1.5ms" || line.Backoff != "2s" {
		t.Errorf("durations timeout=%#v redis.deadline=%#v backoff=%#v, want \"10ms\", \"1.5ms\", \"2s\": %s",
			line.Timeout, line.Redis.Deadline, line.Backoff, buf.String())
	}
	if line.Count != float64(3) {
		t.Errorf("count = %#v, want the number 3 (only durations become text)", line.Count)
	}
}

// TestTextLogDurations: the text handler already writes "10ms"; it stays so.
func TestTextLogDurations(t *testing.T) {
	var buf bytes.Buffer
	log := newLogger(slog.LevelInfo, flags.LogText, &buf)
	log.Info("draining", "timeout", 10*time.Millisecond)
	if !strings.Contains(buf.String(), " timeout=10ms") {
		t.Errorf("text line %q lacks timeout=10ms", buf.String())
	}
}
