package node

import (
	"net/http"
	"strings"
	"testing"
)

// TestPublicMuxSaysWhereAdminPathsAre: /json, /usage, /usage/top and
// /overrides on the HTTP address answer 404 naming the admin address, or
// saying it is off.
func TestPublicMuxSaysWhereAdminPathsAre(t *testing.T) {
	for _, admin := range []string{"127.0.0.1:0", ""} {
		opts := testOptions()
		opts.AdminAddr = admin
		rls := start(t, opts)
		want := "is served on the admin address 127.0.0.1:0 (--admin-addr)"
		if admin == "" {
			want = "is served on the admin address, which is off (--admin-addr is empty)"
		}
		for _, path := range []string{"/json", "/usage?domain=edge&descriptor=user_id%3Da", "/usage/top", "/overrides"} {
			if code, body := httpGet(t, rls.HTTP()+path); code != http.StatusNotFound || !strings.Contains(body, want) {
				t.Errorf("admin address %q: %s on the HTTP address: %d %q, want 404 %q", admin, path, code, body, want)
			}
		}
		rls.StopCleanly()
	}
}

// TestMetricsAddr: with --metrics-addr, /metrics is served on a listener
// of its own at --metrics-path, and only there (the series of the HTTP
// address's /metrics, which stays); without it there is no such listener.
func TestMetricsAddr(t *testing.T) {
	opts := testOptions()
	opts.MetricsAddr, opts.MetricsPath = "127.0.0.1:0", "/stats/prometheus"
	rls := start(t, opts)
	if _, err := rls.Client().ShouldRateLimit(t.Context(), edgeRequest("remote_address", "10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	base := "http://" + rls.Addrs().Metrics.String()
	const series = `ratelimit_requests_total{code="ok",domain="edge"} 1`
	if code, body := httpGet(t, base+"/stats/prometheus"); code != http.StatusOK || !strings.Contains(body, series) {
		t.Errorf("--metrics-path on --metrics-addr: %d, want 200 with %s:\n%s", code, series, grepLines(body, "ratelimit_requests_total"))
	}
	if code, _ := httpGet(t, base+"/healthcheck"); code != http.StatusNotFound {
		t.Errorf("/healthcheck on --metrics-addr: %d, want 404 (metrics alone)", code)
	}
	if code, body := httpGet(t, rls.HTTP()+"/metrics"); code != http.StatusOK || !strings.Contains(body, series) {
		t.Errorf("/metrics on --http-addr: %d, want 200 with %s", code, series)
	}
	rls.StopCleanly()
	if a := start(t, testOptions()).Addrs(); a.Metrics != nil {
		t.Errorf("without --metrics-addr: a metrics listener on %v", a.Metrics)
	}
}
