package adaptive_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rls/sluice/adaptive"
	"github.com/sluice-rls/sluice/override"
)

// syncBuffer is a log destination the test reads while nothing writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// count returns how many log lines hold msg.
func (s *syncBuffer) count(msg string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Count(s.b.String(), `msg="`+msg)
}

// loggedRig is r with a controller that logs to the returned buffer.
func loggedRig(t *testing.T, yaml string) (*rig, *syncBuffer) {
	r := newRig(t, yaml, nil)
	var buf syncBuffer
	r.reg = prometheus.NewRegistry()
	r.ctl = adaptive.New(adaptive.Options{Config: r.cfg, Source: r.src, Overrides: r.mgr, Rules: r.rules, Clock: r.clock, Audit: r.rec, Node: "n1",
		Registerer: r.reg, Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	return r, &buf
}

// TestDryRunLogsAndExports: a dry run logs each change it would make, with
// the old and new scale, and says so in ratelimit_adaptive_dry_run.
func TestDryRunLogsAndExports(t *testing.T) {
	t.Parallel()
	r, log := loggedRig(t, strings.Replace(latencyPolicy, "policies:", "dry_run: true\npolicies:", 1))
	r.src.set("p99", 2)
	r.step(time.Second)
	r.step(time.Second)
	if n := log.count("adaptive: dry run: would change the scale"); n != 2 {
		t.Errorf("%d dry-run lines for two would-be changes, want 2:\n%s", n, log.b.String())
	}
	if !strings.Contains(log.b.String(), "old=0.8 new=0.64") {
		t.Errorf("dry-run log lacks the old and new scale:\n%s", log.b.String())
	}
	if v := r.metric("ratelimit_adaptive_dry_run"); v != 1 {
		t.Errorf("ratelimit_adaptive_dry_run = %v, want 1", v)
	}
}

// TestSignalErrorsCountedLoggedOnce: every read that gives no number is
// counted; the log says so once per outage, and once when it is back.
func TestSignalErrorsCountedLoggedOnce(t *testing.T) {
	t.Parallel()
	r, log := loggedRig(t, latencyPolicy)
	for range 3 { // no value set: an empty result
		r.step(time.Second)
	}
	if v := r.metric("ratelimit_adaptive_signal_errors_total"); v != 3 {
		t.Errorf("ratelimit_adaptive_signal_errors_total = %v after 3 empty reads, want 3", v)
	}
	if n := log.count("adaptive: signal gives no number"); n != 1 {
		t.Errorf("%d 'signal gives no number' lines for one outage, want 1", n)
	}
	r.src.set("p99", 0.5)
	r.step(time.Second)
	if n := log.count("adaptive: signal gives a number again"); n != 1 {
		t.Errorf("%d 'gives a number again' lines, want 1", n)
	}
	if v := r.metric("ratelimit_adaptive_signal"); v != 0.5 {
		t.Errorf("ratelimit_adaptive_signal = %v, want 0.5", v)
	}
}

// TestOperatorOverrideLoggedOnce: the policy standing aside for an
// operator's override, and adapting again once it is gone, are logged once
// each, however many intervals pass.
func TestOperatorOverrideLoggedOnce(t *testing.T) {
	t.Parallel()
	r, log := loggedRig(t, latencyPolicy)
	r.src.set("p99", 2)
	o, err := r.mgr.Set(context.Background(), override.Override{Domain: "edge", Kind: override.KindScale, Factor: 0.5, Reason: "incident"}, "alice")
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		r.step(time.Second)
	}
	if n := log.count("adaptive: an operator's override covers the policy's scope"); n != 1 {
		t.Errorf("%d stand-aside lines over 3 intervals, want 1", n)
	}
	if r.src.calls != 0 {
		t.Errorf("%d queries while standing aside, want none", r.src.calls)
	}
	if _, err := r.mgr.Remove(context.Background(), o.ID, "alice", "over"); err != nil {
		t.Fatal(err)
	}
	r.step(time.Second)
	r.step(time.Second)
	if n := log.count("adaptive: the operator's override is gone"); n != 1 {
		t.Errorf("%d 'override is gone' lines, want 1", n)
	}
}
