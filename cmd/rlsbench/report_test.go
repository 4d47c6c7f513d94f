package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestReport(t *testing.T) {
	var out bytes.Buffer
	if err := printReport("testdata/results.jsonl", &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		// Medians per figure: QPS 11000, p50 2, p99 5, CPU 11.
		"| noop | envoy | 3 | 11000 | — | — | 2.000 | 5.000 | — | 100.0% | 0 | 11.0 | — | – | – | – | – | 0.05 |",
		// 9500 / 11000 = 86%; from CPU (11+10) / (13+14) = 78%; p99 6 / 5;
		// CPU 13 / 11; one error over the runs.
		"| memory | envoy | 3 | 9500 | 86% | 78% | 1.000 | 6.000 | 1.20× | 90.0% | 1 | 13.0 | 1.18× | – | – | – | 0 | 0.30 |",
		// No no-op hot run: ratios n/a.
		"| redis | hot (over-limit) | 1 | 5000 | n/a | n/a | 1.000 | 9.000 | n/a | 1.0% | 0 | 9.0 | n/a | 0.040 | 0.010 | 0.3 | 2, active | – |",
		"| redis | envoy | 0 | n/a |",
		"redis envoy: n/a, rls serve did not serve: no Redis\n",
		"| memory, envoy: QPS vs no-op | ≥ 85% | 86% | yes |",
		"| memory, envoy: QPS vs no-op from CPU | ≥ 85% | 78% | no |",
		"| redis, envoy: QPS vs no-op | ≥ 75% | pending | pending |",
		"| redis, hot (over-limit): QPS vs no-op | ≥ 90% | pending | pending |",
		"Warning: other processes used up to 0.30 cores",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q; got:\n%s", want, got)
		}
	}
}

func TestGoalMissed(t *testing.T) {
	in := `{"backend":"noop","mix":"envoy","qps":1000,"p99_ms":2,"total":1,"ok":1,"server_cpu_us_per_req":10}
{"backend":"redis","mix":"envoy","qps":700,"p99_ms":3,"total":1,"ok":1,"server_cpu_us_per_req":16}
{"backend":"noop","mix":"envoy","tag":"at the Redis QPS","rate":700,"qps":700,"p99_ms":1,"total":1,"ok":1,"server_cpu_us_per_req":12.8}
`
	res, err := readResults(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	res.writeGoals(&out)
	for _, want := range []string{
		"| redis, envoy: QPS vs no-op | ≥ 75% | 70% | no |",
		"| redis, envoy: p99 vs no-op | ≤ 1.5× | 1.50× | yes |",
		"| redis, envoy: server CPU/request vs no-op | ≤ 1.5× | 1.60× | no |",
		// Against the no-op paced at the Redis row's 700 QPS: 16 / 12.8.
		"| redis, envoy: server CPU/request vs no-op at the same QPS | ≤ 1.5× | 1.25× | yes |",
		"| redis, hot: server CPU/request vs no-op at the same QPS | ≤ 1.5× | pending | pending |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("goals lack %q; got:\n%s", want, out.String())
		}
	}
}

func TestMedian(t *testing.T) {
	tests := []struct {
		in   []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	}
	for _, tt := range tests {
		if got := median(append([]float64(nil), tt.in...)); got != tt.want {
			t.Errorf("median(%v) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestReportRejectsBadLine(t *testing.T) {
	_, err := readResults(strings.NewReader("{\"mix\":\"hot\"}\nnot json\n"))
	if err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("readResults(bad line 2) = %v, want an error naming line 2", err)
	}
}
