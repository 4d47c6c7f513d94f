package examples

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
)

// totalRequestsRow is the guide's row for the peer's total_requests: its
// PromQL is the first code span of the second cell.
var totalRequestsRow = regexp.MustCompile("(?m)^\\| `ratelimit_server\\.ShouldRateLimit\\.total_requests`[^|]*\\| `([^`]+)`")

// TestMigrationGuideTotalRequests evaluates the PromQL that
// docs/migrating-from-envoy-ratelimit.md gives for the peer's
// total_requests with promtool, on two nodes' series: it must add the
// requests of known domains, of unknown domains and the invalid ones of
// every node (60 a minute each below: 1+1+1+1 per second).
func TestMigrationGuideTotalRequests(t *testing.T) {
	doc, err := os.ReadFile("../docs/migrating-from-envoy-ratelimit.md")
	if err != nil {
		t.Fatal(err)
	}
	m := totalRequestsRow.FindSubmatch(doc)
	if m == nil {
		t.Fatal("no total_requests row with a PromQL expression in the migration guide")
	}
	promtool(t) // skips without it, before any work
	test := `evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'ratelimit_requests_total{instance="a",domain="edge",code="ok"}'
        values: '0+60x10'
      - series: 'ratelimit_requests_total{instance="b",domain="edge",code="over_limit"}'
        values: '0+60x10'
      - series: 'ratelimit_unknown_domain_requests_total{instance="a"}'
        values: '0+60x10'
      - series: 'ratelimit_unknown_domain_requests_total{instance="b"}'
        values: '0+0x10'
      - series: 'ratelimit_invalid_requests_total{instance="a"}'
        values: '0+0x10'
      - series: 'ratelimit_invalid_requests_total{instance="b"}'
        values: '0+60x10'
    promql_expr_test:
      - expr: ` + strconv.Quote(string(m[1])) + `
        eval_time: 10m
        exp_samples:
          - labels: '{}'
            value: 4
`
	path := filepath.Join(t.TempDir(), "total_requests.test.yaml")
	if err := os.WriteFile(path, []byte(test), 0o600); err != nil {
		t.Fatal(err)
	}
	runPromtool(t, "test", "rules", path)
}
