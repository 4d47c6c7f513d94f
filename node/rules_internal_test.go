package node

import (
	"bytes"
	"context"
	"log/slog"
	"os"
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
