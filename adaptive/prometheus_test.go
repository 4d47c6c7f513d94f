package adaptive_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-rls/sluice/adaptive"
	"github.com/sluice-rls/sluice/internal/promtest"
)

// backend is a scrape target whose latency and error metrics the test sets.
type backend struct {
	latency, errors prometheus.Gauge
	srv             *httptest.Server
}

func newBackend(t *testing.T) *backend {
	reg := prometheus.NewRegistry()
	b := &backend{
		latency: prometheus.NewGauge(prometheus.GaugeOpts{Name: "backend_latency_p99_seconds", Help: "p99 latency"}),
		errors:  prometheus.NewGauge(prometheus.GaugeOpts{Name: "backend_error_ratio", Help: "errors per request"}),
	}
	reg.MustRegister(b.latency, b.errors)
	b.srv = httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(b.srv.Close)
	return b
}

// TestWithPrometheus runs a policy against a real Prometheus scraping a
// target whose latency and error ratio the test moves: the scale drops at
// the first evaluation that sees the latency, holds through a Prometheus
// restart and follows the signal again, never below min_scale; Prometheus
// down for stale_after returns it to 1; it drops again once Prometheus is
// back, returns to 1 after recovery, and drops on the error ratio alone. The controller's clock is fake: each
// evaluation is one Step.
func TestWithPrometheus(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	b.latency.Set(0.1)
	prom := promtest.Start(t, strings.TrimPrefix(b.srv.URL, "http://"))
	src, err := adaptive.NewPrometheus(prom.URL(), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	const p99 = `max(backend_latency_p99_seconds)`
	yaml := fmt.Sprintf(`prometheus: %s
policies:
  - name: latency
    domain: edge
    rule: edge.user_id
    interval: 1s
    cooldown: 1s
    stale_after: 4s
    min_scale: 0.6
    signals:
      - {name: p99, query: '%s', lower_above: 1, raise_below: 0.2}
      - {name: errors, query: 'max(backend_error_ratio)', lower_above: 0.05, raise_below: 0.01}
`, prom.URL(), p99)
	r := newRig(t, yaml, nil)
	r.ctl = adaptive.New(adaptive.Options{Config: r.cfg, Source: src, Overrides: r.mgr, Rules: r.rules, Clock: r.clock, Audit: r.rec, Node: "n1", Registerer: prometheus.NewRegistry()})
	sees := func(q string, want float64) func(context.Context) error {
		return func(ctx context.Context) error {
			v, err := src.Query(ctx, q)
			if err == nil && v != want {
				err = fmt.Errorf("%s = %v, want %v", q, v, want)
			}
			return err
		}
	}
	scale := func() float64 { s, _ := r.scale("edge", "edge.user_id"); return s }
	promtest.WaitFor(t, 20*time.Second, sees(p99, 0.1))
	r.step(time.Second)
	if s := scale(); s != 1 {
		t.Fatalf("healthy backend: scale %v, want 1", s)
	}

	b.latency.Set(2)
	promtest.WaitFor(t, 10*time.Second, sees(p99, 2))
	steps := func(n int) []float64 {
		var got []float64
		for range n {
			r.step(time.Second)
			got = append(got, scale())
		}
		return got
	}
	if got, want := steps(2), []float64{0.8, 0.64}; !equal(got, want) {
		t.Fatalf("latency high: scales %v, want %v (one step per interval)", got, want)
	}

	// Prometheus restarts within stale_after: the scale holds, then follows
	// the signal again, down to min_scale and no further.
	prom.Kill()
	if got, want := steps(3), []float64{0.64, 0.64, 0.64}; !equal(got, want) {
		t.Fatalf("Prometheus down: scales %v, want %v held", got, want)
	}
	prom.Restart()
	promtest.WaitFor(t, 20*time.Second, sees(p99, 2))
	if got, want := steps(3), []float64{0.6, 0.6, 0.6}; !equal(got, want) {
		t.Fatalf("Prometheus back, latency high: scales %v, want %v (min_scale 0.6)", got, want)
	}

	// Prometheus down for stale_after: back to 1.
	prom.Kill()
	if got, want := steps(4), []float64{0.6, 0.6, 0.6, 1}; !equal(got, want) {
		t.Fatalf("Prometheus down: scales %v, want %v (held, then 1 after stale_after 4s)", got, want)
	}
	prom.Restart()
	promtest.WaitFor(t, 20*time.Second, sees(p99, 2))
	r.step(time.Second)
	if s := scale(); s != 0.8 {
		t.Fatalf("Prometheus back, latency still high: scale %v, want 0.8", s)
	}

	b.latency.Set(0.1)
	promtest.WaitFor(t, 10*time.Second, sees(p99, 0.1))
	r.step(time.Second)
	r.step(time.Second)
	r.step(time.Second)
	if s := scale(); s != 1 {
		t.Fatalf("recovered: scale %v after three intervals, want 1", s)
	}
	if k := r.kinds(); len(k) != 4 || k[0] != "adaptive.trigger" || k[1] != "adaptive.restore" || k[2] != "adaptive.trigger" || k[3] != "adaptive.restore" {
		t.Errorf("audit events %v, want trigger, restore (stale), trigger, restore", k)
	}

	b.errors.Set(0.1) // the error rate alone lowers it too
	promtest.WaitFor(t, 10*time.Second, sees("max(backend_error_ratio)", 0.1))
	r.step(time.Second)
	if s := scale(); s != 0.8 {
		t.Fatalf("error ratio high: scale %v, want 0.8", s)
	}

	// What the source makes of results that are not one number.
	ctx := context.Background()
	if _, err := src.Query(ctx, "no_such_metric"); !errors.Is(err, adaptive.ErrEmpty) {
		t.Errorf("empty result: %v, want ErrEmpty", err)
	}
	if v, err := src.Query(ctx, "0/0"); err != nil || !math.IsNaN(v) {
		t.Errorf("0/0 = %v, %v; want NaN", v, err)
	}
	if _, err := src.Query(ctx, `up or vector(1)`); err == nil || !strings.Contains(err.Error(), "2 series") {
		t.Errorf("two series: %v, want an error naming them", err)
	}
}

// TestCooldownWithPrometheus: against a real Prometheus whose target
// stays slow, a policy evaluated every second with a 3 s cooldown moves
// once per cooldown, not once per interval.
func TestCooldownWithPrometheus(t *testing.T) {
	t.Parallel()
	b := newBackend(t)
	b.latency.Set(2)
	prom := promtest.Start(t, strings.TrimPrefix(b.srv.URL, "http://"))
	src, err := adaptive.NewPrometheus(prom.URL(), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	const p99 = `max(backend_latency_p99_seconds)`
	r := newRig(t, fmt.Sprintf(`prometheus: %s
policies:
  - name: latency
    domain: edge
    rule: edge.user_id
    interval: 1s
    cooldown: 3s
    signals:
      - {name: p99, query: '%s', lower_above: 1, raise_below: 0.2}
`, prom.URL(), p99), nil)
	r.ctl = adaptive.New(adaptive.Options{Config: r.cfg, Source: src, Overrides: r.mgr, Rules: r.rules, Clock: r.clock, Audit: r.rec, Node: "n1", Registerer: prometheus.NewRegistry()})
	promtest.WaitFor(t, 20*time.Second, func(ctx context.Context) error {
		if v, err := src.Query(ctx, p99); err != nil || v != 2 {
			return fmt.Errorf("p99 %v, %v; want 2 scraped", v, err)
		}
		return nil
	})
	var got []float64
	for range 7 {
		r.step(time.Second)
		s, _ := r.scale("edge", "edge.user_id")
		got = append(got, s)
	}
	if want := []float64{0.8, 0.8, 0.8, 0.64, 0.64, 0.64, 0.512}; !equal(got, want) {
		t.Errorf("scales every second with a 3 s cooldown: %v, want %v", got, want)
	}
}
