package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// metricsSample holds sluice's fallback metrics read at one edge of the
// window.
type metricsSample struct {
	transitions float64 // ratelimit_fallback_transitions_total{to="fallback"}
	active      float64 // ratelimit_fallback_active
	seen        bool    // the server exports them (it runs a global layer that can fail)
}

// sampleMetrics scrapes a Prometheus text endpoint.
func sampleMetrics(ctx context.Context, url string) (metricsSample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return metricsSample{}, fmt.Errorf("metrics: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return metricsSample{}, fmt.Errorf("metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return metricsSample{}, fmt.Errorf("metrics: GET %s: %s", url, resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics reads the fallback series from Prometheus text format.
func parseMetrics(r io.Reader) (metricsSample, error) {
	var m metricsSample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var dst *float64
		switch {
		case strings.HasPrefix(line, "ratelimit_fallback_transitions_total{") && strings.Contains(line, `to="fallback"`):
			dst = &m.transitions
		case strings.HasPrefix(line, "ratelimit_fallback_active "), strings.HasPrefix(line, "ratelimit_fallback_active{"):
			dst = &m.active
		default:
			continue
		}
		f := strings.Fields(line[max(strings.LastIndexByte(line, '}'), strings.IndexByte(line, ' '))+1:])
		if len(f) == 0 {
			return m, fmt.Errorf("metrics: no value in %q", line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return m, fmt.Errorf("metrics: %q: %w", line, err)
		}
		*dst += v
		m.seen = true
	}
	return m, sc.Err()
}
