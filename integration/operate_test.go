//go:build integration

package integration

import (
	"context"
	"crypto/tls"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluice-rls/sluice/internal/pkitest"
)

func TestMetricsScrape(t *testing.T) {
	t.Parallel()
	p := startRLS(t)
	// Counts that timing cannot change: 20 requests inside user_id's burst
	// of 20, and 5 for the blocked address (0 per second).
	for range 20 {
		p.Check(t, "edge", "user_id=scrape")
	}
	for range 5 {
		p.Check(t, "edge", "remote_address=50.0.0.5")
	}
	p.Check(t, "nope", "a=b")
	_, body := p.HTTPGet(t, "/metrics")
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	types := map[string]dto.MetricType{
		"ratelimit_requests_total":                        dto.MetricType_COUNTER,
		"ratelimit_decisions_total":                       dto.MetricType_COUNTER,
		"ratelimit_request_duration_seconds":              dto.MetricType_HISTOGRAM,
		"ratelimit_unknown_domain_requests_total":         dto.MetricType_COUNTER,
		"ratelimit_config_loads_total":                    dto.MetricType_COUNTER,
		"ratelimit_config_last_success_timestamp_seconds": dto.MetricType_GAUGE,
		"ratelimit_memory_buckets":                        dto.MetricType_GAUGE,
	}
	for name, want := range types {
		f, ok := families[name]
		if !ok {
			t.Errorf("/metrics lacks %s", name)
			continue
		}
		if f.GetType() != want {
			t.Errorf("%s has type %v, want %v", name, f.GetType(), want)
		}
	}
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"ratelimit_requests_total", map[string]string{"domain": "edge", "code": "ok"}, 20},
		{"ratelimit_requests_total", map[string]string{"domain": "edge", "code": "over_limit"}, 5},
		{"ratelimit_decisions_total", map[string]string{"rule": "edge.user_id", "layer": "global"}, 20},
		{"ratelimit_decisions_total", map[string]string{"rule": "edge.remote_address_50.0.0.5", "layer": "global", "result": "over_limit"}, 5},
		{"ratelimit_unknown_domain_requests_total", nil, 1},
		{"ratelimit_config_loads_total", map[string]string{"result": "success"}, 1},
	}
	for _, c := range checks {
		if got := sumSeries(families[c.name], c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if n := sumHistogramCount(families["ratelimit_request_duration_seconds"]); n != 26 {
		t.Errorf("duration histogram counted %d requests, want 26 (every answered request)", n)
	}
	if ts := sumSeries(families["ratelimit_config_last_success_timestamp_seconds"], nil); time.Since(time.Unix(int64(ts), 0)) > time.Minute {
		t.Errorf("last success timestamp %v is not recent", ts)
	}
}

func sumSeries(f *dto.MetricFamily, labels map[string]string) float64 {
	total := 0.0
series:
	for _, m := range f.GetMetric() {
		for _, lp := range m.GetLabel() {
			if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
				continue series
			}
		}
		total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return total
}

func sumHistogramCount(f *dto.MetricFamily) uint64 {
	var n uint64
	for _, m := range f.GetMetric() {
		n += m.GetHistogram().GetSampleCount()
	}
	return n
}

func TestReloadThroughTheBinary(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rules := func(n string) string {
		return "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: " + n + "}\n"
	}
	file := writeFile(t, dir, "rules.yaml", rules("2"))
	p := startRLS(t, "--config", dir)
	limit := func() uint32 {
		return p.Check(t, "r", "k=x").GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
	}
	if got := limit(); got != 2 {
		t.Fatalf("initial limit %d, want 2", got)
	}
	// A broken file keeps the running rules and is logged with file:line.
	writeFile(t, dir, "rules.yaml", "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n")
	waitForLog(t, p, "rules.yaml:4:")
	if got := limit(); got != 2 {
		t.Errorf("after a bad file the limit is %d, want 2", got)
	}
	// A good file reloads by itself (fsnotify) …
	writeFile(t, dir, "rules.yaml", rules("7"))
	pollUntil(t, "the file change to reload", func() bool { return limit() == 7 })
	// … and on SIGHUP.
	if err := os.WriteFile(file, []byte(rules("9")), 0o644); err != nil {
		t.Fatal(err)
	}
	p.Signal(t, syscall.SIGHUP)
	pollUntil(t, "SIGHUP to reload", func() bool { return limit() == 9 })
	if !strings.Contains(p.Log(), "rule changed") {
		t.Errorf("log lacks the old → new line:\n%s", p.Log())
	}
}

// mTLS is a test PKI with the flags that make rls serve use it.
type mTLS struct {
	pkitest.PKI
	flags []string // --tls-cert, --tls-key, --tls-client-ca and their files
}

// newMTLS writes a PKI to a temporary directory.
func newMTLS(t *testing.T) mTLS {
	t.Helper()
	p := pkitest.New(t)
	return mTLS{PKI: p, flags: []string{"--tls-cert", p.ServerCert, "--tls-key", p.ServerKey, "--tls-client-ca", p.CA}}
}

func TestMutualTLS(t *testing.T) {
	t.Parallel()
	m := newMTLS(t)
	p := startRLS(t, m.flags...)
	roots := m.Roots
	call := func(certs []tls.Certificate) error {
		creds := credentials.NewTLS(&tls.Config{RootCAs: roots, Certificates: certs, ServerName: "sluice"})
		conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(creds))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, request("edge", "user_id=tls"))
		return err
	}
	if err := call([]tls.Certificate{m.Client}); err != nil {
		t.Errorf("client with a valid certificate: %v", err)
	}
	if err := call(nil); err == nil {
		t.Errorf("client without a certificate was served")
	}
	// Plaintext is refused too.
	if _, err := p.Client.ShouldRateLimit(context.Background(), request("edge", "user_id=tls")); err == nil {
		t.Errorf("plaintext client was served")
	}
}

// pollUntil polls cond with a deadline.
func pollUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitForLog(t *testing.T, p *rlsProcess, substr string) {
	t.Helper()
	pollUntil(t, "log line "+substr, func() bool { return strings.Contains(p.Log(), substr) })
}

func TestPprofBehindFlag(t *testing.T) {
	t.Parallel()
	off := startRLS(t)
	if code, _ := off.AdminGet(t, "/debug/pprof/"); code != 404 {
		t.Errorf("/debug/pprof/ without --pprof: %d, want 404", code)
	}
	on := startRLS(t, "--pprof")
	if code, body := on.AdminGet(t, "/debug/pprof/"); code != 200 || !strings.Contains(body, "goroutine") {
		t.Errorf("/debug/pprof/ with --pprof: %d", code)
	}
	// Only on the admin address, not on the HTTP one.
	if code, _ := on.HTTPGet(t, "/debug/pprof/"); code != 404 {
		t.Errorf("/debug/pprof/ on --http-addr: %d, want 404", code)
	}
}
