package examples

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// metricSpec is one metric of docs/metrics.md's table.
type metricSpec struct {
	histogram bool
	labels    []string
}

// documentedMetrics reads the metric names, types and labels from the table
// of docs/metrics.md, the contract the alerts and the dashboard are held to:
// a row is | `name` | type | labels | meaning |, its labels the backquoted
// words of the third cell outside parentheses (inside them: values).
func documentedMetrics(t *testing.T) map[string]metricSpec {
	t.Helper()
	specs := map[string]metricSpec{}
	for line := range strings.SplitSeq(repoFile(t, "docs/metrics.md"), "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 5 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`ratelimit_") {
			continue
		}
		name := strings.Trim(strings.TrimSpace(cells[1]), "`")
		spec := metricSpec{histogram: strings.TrimSpace(cells[2]) == "histogram"}
		depth := 0
		var outside strings.Builder
		for _, r := range cells[3] {
			switch {
			case r == '(':
				depth++
			case r == ')':
				depth--
			case depth == 0:
				outside.WriteRune(r)
			}
		}
		for _, m := range backquoted.FindAllStringSubmatch(outside.String(), -1) {
			spec.labels = append(spec.labels, m[1])
		}
		specs[name] = spec
	}
	if len(specs) == 0 {
		t.Fatal("docs/metrics.md: no metric table")
	}
	return specs
}

// targetLabels are the labels Prometheus adds to every scraped series.
var targetLabels = []string{"instance", "job", "namespace", "pod", "service", "container", "endpoint"}

var (
	metricName   = regexp.MustCompile(`\bratelimit_[a-z_]+\b`)
	selector     = regexp.MustCompile(`\b(ratelimit_[a-z_]+)\s*\{([^}]*)\}`)
	matcherLabel = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	grouping     = regexp.MustCompile(`\b(?:by|without|on|ignoring)\s*\(([^)]*)\)`)
	backquoted   = regexp.MustCompile("`([a-z_]+)`")
)

// documentedMetric resolves a series name to its metric in specs: the name
// itself, or a histogram's _bucket, _sum or _count series.
func documentedMetric(specs map[string]metricSpec, series string) (base string, spec metricSpec, ok bool) {
	if spec, ok := specs[series]; ok {
		return series, spec, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base := strings.TrimSuffix(series, suffix)
		if spec, ok := specs[base]; ok && base != series && spec.histogram {
			return base, spec, true
		}
	}
	return "", metricSpec{}, false
}

// recordedName is a series recorded by a rule of prometheus-rules.yaml.
var recordedName = regexp.MustCompile(`\bsluice:[a-z0-9_:]+`)

// checkExpr checks that a PromQL expression uses only metrics of
// docs/metrics.md or series of records (name → labels), at least one, and
// only their labels (or target labels) in selectors and groupings.
func checkExpr(t *testing.T, where, expr string, records map[string][]string) {
	t.Helper()
	specs := documentedMetrics(t)
	names := metricName.FindAllString(expr, -1)
	recorded := recordedName.FindAllString(expr, -1)
	if len(names) == 0 && len(recorded) == 0 {
		t.Errorf("%s: expression uses no sluice metric: %s", where, expr)
	}
	allowed := slices.Clone(targetLabels)
	for _, n := range recorded {
		labels, ok := records[n]
		if !ok {
			t.Errorf("%s: %s is recorded by no rule of prometheus-rules.yaml", where, n)
		}
		allowed = append(allowed, labels...)
	}
	for _, n := range names {
		base, spec, ok := documentedMetric(specs, n)
		if !ok {
			t.Errorf("%s: %s is not a metric of docs/metrics.md", where, n)
			continue
		}
		allowed = append(allowed, spec.labels...)
		if base != n {
			allowed = append(allowed, "le")
		}
	}
	for _, m := range selector.FindAllStringSubmatch(expr, -1) {
		_, spec, ok := documentedMetric(specs, m[1])
		if !ok {
			continue
		}
		for _, lm := range matcherLabel.FindAllStringSubmatch(m[2], -1) {
			if !slices.Contains(spec.labels, lm[1]) && !slices.Contains(targetLabels, lm[1]) && lm[1] != "le" {
				t.Errorf("%s: %s has no label %q (docs/metrics.md: %v)", where, m[1], lm[1], spec.labels)
			}
		}
	}
	for _, g := range grouping.FindAllStringSubmatch(expr, -1) {
		for l := range strings.SplitSeq(g[1], ",") {
			if l = strings.TrimSpace(l); l != "" && !slices.Contains(allowed, l) {
				t.Errorf("%s: grouping by %q, a label none of its metrics has", where, l)
			}
		}
	}
}

// promRuleFile is a Prometheus rule file.
type promRuleFile struct {
	Groups []struct {
		Name     string `yaml:"name"`
		Interval string `yaml:"interval,omitempty"`
		Rules    []struct {
			Alert       string            `yaml:"alert,omitempty"`
			Record      string            `yaml:"record,omitempty"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for,omitempty"`
			Labels      map[string]string `yaml:"labels,omitempty"`
			Annotations map[string]string `yaml:"annotations,omitempty"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// runbookBase is where the alerts' runbooks live: docs/operations.md.
const runbookBase = "https://github.com/sluice-rls/sluice/blob/main/docs/operations.md#"

// checkScoped checks that an aggregation keeps job and namespace, so that two
// sluice deployments scraped by one Prometheus alert apart.
func checkScoped(t *testing.T, where, expr string) {
	t.Helper()
	for _, g := range grouping.FindAllStringSubmatch(expr, -1) {
		if !strings.HasPrefix(strings.TrimSpace(g[0]), "by") && !strings.HasPrefix(strings.TrimSpace(g[0]), "on") {
			continue
		}
		labels := strings.Split(strings.ReplaceAll(g[1], " ", ""), ",")
		if !slices.Contains(labels, "job") || !slices.Contains(labels, "namespace") {
			t.Errorf("%s: %s drops job or namespace", where, g[0])
		}
	}
}

func TestPrometheusRules(t *testing.T) {
	data, err := os.ReadFile("prometheus-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var f promRuleFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		t.Fatalf("prometheus-rules.yaml: %v", err)
	}
	alerts := make(map[string]string)
	// Recorded series and their labels: those its expression groups by,
	// else those of the recorded series it reads.
	records := make(map[string][]string)
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Record == "" {
				continue
			}
			where := "prometheus-rules.yaml: " + g.Name + "/" + r.Record
			if r.Alert != "" {
				t.Errorf("%s: both record and alert", where)
			}
			if by := grouping.FindStringSubmatch(r.Expr); by != nil {
				records[r.Record] = strings.Split(strings.ReplaceAll(by[1], " ", ""), ",")
			} else {
				for _, n := range recordedName.FindAllString(r.Expr, -1) {
					records[r.Record] = append(records[r.Record], records[n]...)
				}
			}
			checkExpr(t, where, r.Expr, records)
			checkScoped(t, where, r.Expr)
		}
	}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				continue
			}
			where := "prometheus-rules.yaml: " + g.Name + "/" + r.Alert
			if r.Alert == "" {
				t.Errorf("%s: a rule that is no alert", where)
			}
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("%s: wants labels.severity and annotations summary and description", where)
			}
			checkExpr(t, where, r.Expr, records)
			checkScoped(t, where, r.Expr)
			if !strings.HasPrefix(r.Annotations["runbook_url"], runbookBase) {
				t.Errorf("%s: runbook_url %q, want a section of %s (integration/doclinks_test.go checks the anchor)", where, r.Annotations["runbook_url"], runbookBase)
			}
			alerts[r.Alert] = r.Expr
		}
	}
	// The alerts the examples promise, by what they must look at.
	for _, want := range []struct{ alert, uses string }{
		{"SluiceRuleTooTight", `ratelimit_decisions_total{result=~"over_limit|shadow_mode"`},
		{"SluiceRuleNeverRefuses", "ratelimit_decisions_total"},
		{"SluiceFallbackActive", "ratelimit_fallback_active == 1"},
		{"SluiceSharesOff", "ratelimit_share_rules_differ"},
		{"SluiceRedisErrors", "ratelimit_redis_errors_total"},
		{"SluiceNeverReachedRedis", `ratelimit_fallback_nodes{source=~"initial|default"}`},
		{"SluiceRedisSlow", "ratelimit_redis_duration_seconds_bucket"},
		{"SluiceConfigLoadFailed", "ratelimit_config_last_load_successful == 0"},
		{"SluiceInvalidRequests", "ratelimit_invalid_requests_total"},
		{"SluiceMalformedRequests", "ratelimit_malformed_parts_total"},
		{"SluiceMemoryTableFull", "ratelimit_memory_full_refusals_total"},
		{"SluiceOverrideMalformed", "ratelimit_override_malformed"},
		{"SluiceEmergencyChannelUsed", `ratelimit_emergency_requests_total{result="allowed"}`},
		{"SluiceEmergencySecretGuessing", `ratelimit_emergency_requests_total{result="rejected"}`},
		{"SluiceEmergencySecretsFileRejected", `ratelimit_emergency_secret_loads_total{result="error"}`},
		{"SluiceAdminTokenFileInvalid", "ratelimit_admin_token_file_valid"},
		{"SluiceEmbeddedExampleRules", "ratelimit_config_embedded == 1"},
		{"SluiceOverrideStoreUnhealthy", "ratelimit_override_store_healthy == 0"},
		{"SluiceXDSDisconnected", "ratelimit_xds_connected == 0"},
		{"SluiceAuditEventsLost", `ratelimit_audit_stream_events_total{result=~"failed|dropped"}`},
		{"SluiceTargetDown", "up == 0"},
		{"SluiceMetricsAbsent", "absent(ratelimit_build_info)"},
		{"SluiceTenantNearQuota", "min_over_time(sluice:tenant_utilisation:ratio_avg1d[60d]) > 0.8"},
		{"SluiceTenantQuotaUnused", "max_over_time(sluice:tenant_utilisation:ratio_avg1d[90d]) < 0.1"},
	} {
		if expr, ok := alerts[want.alert]; !ok || !strings.Contains(expr, want.uses) {
			t.Errorf("alert %s missing or not on %s: %q", want.alert, want.uses, expr)
		}
	}
	// No alert names a rule of the example rules (or any rule): yours differ.
	for name, expr := range alerts {
		if m := ruleMatcher.FindString(expr); m != "" {
			t.Errorf("alert %s names a rule (%s): rule paths are the user's", name, m)
		}
	}
}

// ruleMatcher is a matcher on the rule label with a value.
var ruleMatcher = regexp.MustCompile(`\brule\s*(=|!=|=~|!~)\s*"[^"]+"`)

// promtool returns the path of promtool, skipping the test without it
// (Debian: apt-get install prometheus).
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("RLS_REQUIRE_PROMTOOL") == "1" {
			t.Fatal("promtool not installed; make test installs it (apt-get install prometheus)")
		}
		t.Skip("promtool not installed (apt-get install prometheus)")
	}
	return p
}

func runPromtool(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command(promtool(t), args...).CombinedOutput()
	if err != nil {
		t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func TestPrometheusRulesPromtool(t *testing.T) {
	runPromtool(t, "check", "rules", "prometheus-rules.yaml")
}

// TestPrometheusRuleUnitTests runs prometheus-rules.test.yaml: series in,
// alerts (with their rendered text) out.
func TestPrometheusRuleUnitTests(t *testing.T) {
	t.Parallel()
	runPromtool(t, "test", "rules", "prometheus-rules.test.yaml")
}

// TestPrometheusLongRuleUnitTests runs prometheus-rules.long.test.yaml: the
// alerts that need days of series, evaluated every ten minutes.
func TestPrometheusLongRuleUnitTests(t *testing.T) {
	t.Parallel()
	runPromtool(t, "test", "rules", "prometheus-rules.long.test.yaml")
}

// TestPrometheusTenantRuleUnitTests runs prometheus-rules.tenant.test.yaml:
// the quota-review rules over three months of series. promtool evaluates
// every rule of its rule files at each step, so it gets the quota-review
// groups of prometheus-rules.yaml alone, in a file of the same name beside a
// copy of the test file (the other alerts would take ten times as long).
func TestPrometheusTenantRuleUnitTests(t *testing.T) {
	t.Parallel()
	tool := promtool(t)
	var all struct {
		Groups []map[string]any `yaml:"groups"`
	}
	if err := yaml.Unmarshal([]byte(repoFile(t, "envoy-examples/prometheus-rules.yaml")), &all); err != nil {
		t.Fatal(err)
	}
	groups := slices.DeleteFunc(all.Groups, func(g map[string]any) bool {
		name, _ := g["name"].(string)
		return !strings.HasPrefix(name, "sluice-tenant-utilisation")
	})
	if len(groups) == 0 {
		t.Fatal("prometheus-rules.yaml has no sluice-tenant-utilisation group")
	}
	rules, err := yaml.Marshal(map[string]any{"groups": groups})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	const test = "prometheus-rules.tenant.test.yaml"
	for name, b := range map[string][]byte{"prometheus-rules.yaml": rules, test: []byte(repoFile(t, "envoy-examples/"+test))} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(tool, "test", "rules", test)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool test rules %s (groups sluice-tenant-utilisation*): %v\n%s", test, err, out)
	}
}

// dashboard is the part of a Grafana dashboard the tests read.
type dashboard struct {
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name string `json:"name"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int             `json:"id"`
	Type       string          `json:"type"`
	Title      string          `json:"title"`
	Datasource json.RawMessage `json:"datasource"`
	GridPos    struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // of collapsed rows
}

func loadDashboard(t *testing.T) *dashboard {
	t.Helper()
	data, err := os.ReadFile("grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	return &d
}

// queryPanels returns the dashboard's panels that are not rows.
func (d *dashboard) queryPanels() []panel {
	var out []panel
	for _, p := range d.Panels {
		if p.Type == "row" {
			out = append(out, p.Panels...)
			continue
		}
		out = append(out, p)
	}
	return out
}

// grafanaVar matches a dashboard variable in a query: $name or ${name}.
var grafanaVar = regexp.MustCompile(`\$\{?([a-zA-Z_][a-zA-Z0-9_]*)\}?`)

// promQL turns a panel query into plain PromQL: Grafana's built-in
// intervals become 5m, dashboard variables match anything.
func promQL(expr string) string {
	return grafanaVar.ReplaceAllStringFunc(expr, func(v string) string {
		if strings.HasPrefix(strings.Trim(v, "${}"), "__") {
			return "5m"
		}
		return ".*"
	})
}

// dashboardScope is the matchers every dashboard selector starts with.
const dashboardScope = `job=~"$job", namespace=~"$namespace", instance=~"$instance"`

var (
	scopedSelector = regexp.MustCompile(`\b(ratelimit_[a-z_]+)\{([^}]*)\}`)
	// bareMetric is a sluice metric followed by neither a selector nor more of its name.
	bareMetric = regexp.MustCompile(`\bratelimit_[a-z_]+(?:[^{a-z_]|$)`)
)

func TestGrafanaDashboard(t *testing.T) {
	d := loadDashboard(t)
	if d.Title == "" || d.UID == "" {
		t.Errorf("dashboard title %q uid %q: both are needed", d.Title, d.UID)
	}
	vars := []string{"__rate_interval", "__interval", "__range"}
	for _, v := range d.Templating.List {
		vars = append(vars, v.Name)
	}
	panels := d.queryPanels()
	var all []string
	ids := make(map[int]bool)
	for _, p := range panels {
		where := fmt.Sprintf("panel %d %q", p.ID, p.Title)
		if ids[p.ID] {
			t.Errorf("%s: duplicate id", where)
		}
		ids[p.ID] = true
		if len(p.Datasource) == 0 {
			t.Errorf("%s: no datasource", where)
		}
		if len(p.Targets) == 0 {
			t.Errorf("%s: no query", where)
		}
		for _, q := range p.Targets {
			for _, m := range grafanaVar.FindAllStringSubmatch(q.Expr, -1) {
				if !slices.Contains(vars, m[1]) {
					t.Errorf("%s: query uses undefined variable $%s", where, m[1])
				}
			}
			checkExpr(t, where, promQL(q.Expr), nil)
			all = append(all, q.Expr)
		}
	}
	checkLayout(t, panels)

	// Scoped: variables job, namespace and instance, and every selector of
	// every query matches on all three.
	for _, v := range []string{"job", "namespace", "instance"} {
		if !slices.Contains(vars, v) {
			t.Errorf("dashboard has no variable %s", v)
		}
	}
	for _, q := range all {
		for _, m := range scopedSelector.FindAllStringSubmatch(q, -1) {
			if !strings.HasPrefix(m[2], dashboardScope) {
				t.Errorf("query %q: %s{%s} is not scoped by {%s}", q, m[1], m[2], dashboardScope)
			}
		}
		if bare := bareMetric.FindString(q); bare != "" {
			t.Errorf("query %q: %s has no selector (not scoped by job, namespace, instance)", q, bare)
		}
	}

	// What the dashboard promises to show (the scope left out).
	joined := strings.NewReplacer(dashboardScope+", ", "", "{"+dashboardScope+"}", "").Replace(strings.Join(all, "\n"))
	for _, want := range []struct{ what, uses string }{
		{"requests", "rate(ratelimit_requests_total"},
		{"429 rate by rule", `by (domain, rule) (rate(ratelimit_decisions_total{domain=~"$domain", result="over_limit"}`},
		{"layer split", "sum by (layer) (rate(ratelimit_decisions_total"},
		{"gray refusals", `ratelimit_decisions_total{domain=~"$domain", result="over_limit", gray="true"}`},
		{"emergency channel", "rate(ratelimit_emergency_requests_total"},
		{"handler latency", "histogram_quantile(0.99, sum by (le) (rate(ratelimit_request_duration_seconds_bucket"},
		{"Redis latency", "histogram_quantile(0.99, sum by (le, op) (rate(ratelimit_redis_duration_seconds_bucket"},
		{"fallback state", "ratelimit_fallback_active"},
		{"live nodes", "ratelimit_live_nodes"},
		{"answers of the standing shares", `sum(rate(ratelimit_share_decisions_total{answer="share"}[$__rate_interval])) / sum(rate(ratelimit_share_decisions_total[$__rate_interval]))`},
		{"share nodes", "ratelimit_share_nodes"},
		{"share cells", `ratelimit_memory_buckets{backend="share"}`},
		{"tenant utilisation", `rate(ratelimit_tenant_consumed_tokens_total{tenant=~"$tenant"}[1h])) / on (rule) group_left () (max by (rule) (ratelimit_tenant_quota_tokens_per_second`},
	} {
		if !strings.Contains(joined, want.uses) {
			t.Errorf("dashboard shows no %s: no query contains %q", want.what, want.uses)
		}
	}
}

// checkLayout checks that no two panels overlap on Grafana's 24-column grid.
func checkLayout(t *testing.T, panels []panel) {
	t.Helper()
	for i, a := range panels {
		g := a.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", a.Title, g)
		}
		for _, b := range panels[i+1:] {
			h := b.GridPos
			if g.X < h.X+h.W && h.X < g.X+g.W && g.Y < h.Y+h.H && h.Y < g.Y+g.H {
				t.Errorf("panels %q %+v and %q %+v overlap", a.Title, g, b.Title, h)
			}
		}
	}
}

// TestGrafanaDashboardPromtool checks every panel query's PromQL syntax
// with promtool, as recording rules of a throwaway rule file.
func TestGrafanaDashboardPromtool(t *testing.T) {
	tool := promtool(t)
	type rule struct {
		Record string `yaml:"record"`
		Expr   string `yaml:"expr"`
	}
	var rules []rule
	for _, p := range loadDashboard(t).queryPanels() {
		for _, q := range p.Targets {
			rules = append(rules, rule{Record: fmt.Sprintf("dashboard:panel%d:%s", p.ID, q.RefID), Expr: promQL(q.Expr)})
		}
	}
	file := map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}}
	data, err := yaml.Marshal(file)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboard-queries.yaml")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(tool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules (the dashboard's queries): %v\n%s", err, out)
	}
}

func TestDocumentedMetrics(t *testing.T) {
	specs := documentedMetrics(t)
	for name, want := range map[string]metricSpec{
		"ratelimit_decisions_total":          {labels: []string{"domain", "rule", "layer", "result", "gray"}},
		"ratelimit_request_duration_seconds": {histogram: true},
		"ratelimit_redis_duration_seconds":   {histogram: true, labels: []string{"op"}},
		"ratelimit_redis_errors_total":       {labels: []string{"kind"}},
		"ratelimit_build_info":               {labels: []string{"version", "commit", "goversion"}},
	} {
		got, ok := specs[name]
		if !ok || got.histogram != want.histogram || !slices.Equal(got.labels, want.labels) {
			t.Errorf("docs/metrics.md %s read as %+v (found %v), want %+v", name, got, ok, want)
		}
	}
}
