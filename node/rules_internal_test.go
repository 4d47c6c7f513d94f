package node

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rls/sluice/ruleset"
)

// TestSIGHUPWithoutConfig: without --config, SIGHUP has no file to read
// again; it must not log an error nor count a failed load (which fires
// SluiceConfigLoadFailed).
func TestSIGHUPWithoutConfig(t *testing.T) {
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	metrics := ruleset.NewReloadMetrics(reg)
	metrics.Loaded(true, time.Unix(1, 0)) // the load at start
	r := &ruleset.Reloader{Log: slog.New(slog.NewTextHandler(&logs, nil)), Metrics: metrics}
	ctx, cancel := context.WithCancel(context.Background())
	hup := make(chan os.Signal) // unbuffered: the second send waits for the first to be handled
	done := make(chan struct{})
	go func() {
		defer close(done)
		reloadOn(ctx, hup, r)
	}()
	hup <- syscall.SIGHUP
	hup <- syscall.SIGHUP
	cancel()
	<-done
	if strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "no --config") {
		t.Errorf("SIGHUP without --config logged:\n%s\nwant no error, and a line saying there is no file to reload", logs.String())
	}
	if v := metricValue(t, reg, "ratelimit_config_last_load_successful"); v != 1 {
		t.Errorf("ratelimit_config_last_load_successful = %v after SIGHUP without --config, want 1", v)
	}
}

// TestRulesStopEndsWatchers: stopping a node's rules ends the goroutines
// that reload them (SIGHUP, the file watch) before it returns, so that none
// outlives the node's Run, on its early returns too.
func TestRulesStopEndsWatchers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	st := testOptions()
	st.Config = path
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	reg := prometheus.NewRegistry()
	src, err := startRules(context.Background(), st, log, reg, newAuditTrail(st, log, reg))
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); watchers() != 2; {
		if time.Now().After(deadline) {
			t.Fatalf("%d rule watchers running, want 2 (SIGHUP and the file)", watchers())
		}
		runtime.Gosched()
	}
	src.stop()
	if n := watchers(); n != 0 {
		t.Fatalf("%d rule watchers still running after stop, want 0", n)
	}
}

// watchers counts the goroutines in reloadOn or Reloader.Watch.
func watchers() int {
	buf := make([]byte, 1<<20)
	stacks := string(buf[:runtime.Stack(buf, true)])
	return strings.Count(stacks, "node.reloadOn(") + strings.Count(stacks, "ruleset.(*Reloader).Watch(")
}
