package descriptors

import (
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

func TestRuleString(t *testing.T) {
	t.Parallel()
	c := mustConfig(t, `
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 1000
      burst: 2000
      local: {unit: second, requests_per_unit: 3200, burst: 64}
  - key: health
    rate_limit: {unlimited: true}
  - key: tenant
    rate_limit:
      local: {unit: second, requests_per_unit: 50}
  - key: route
    value: /api/orders
    descriptors:
      - key: user_id
        shadow_mode: true
        rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 10, name: orders_per_user, replaces: [{name: x}]}
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0, name: x}
`)
	want := []string{
		"edge.blocked: global 0/second burst 0, name x",
		"edge.health: unlimited",
		"edge.remote_address: global 1000/second burst 2000, local 3200/second burst 64",
		"edge.route_/api/orders.user_id: global 10/5 minutes burst 10, shadow_mode, name orders_per_user, replaces x",
		"edge.tenant: local 50/second burst 50",
	}
	rules := c.Rules()
	if len(rules) != len(want) {
		t.Fatalf("Rules() has %d rules, want %d", len(rules), len(want))
	}
	for i, r := range rules {
		if got := r.String(); got != want[i] {
			t.Errorf("Rules()[%d].String() = %q, want %q", i, got, want[i])
		}
	}
	tenant := c.Domain("edge").Match(entries("tenant=t"))
	if tenant.Global != nil || tenant.Local == nil || tenant.Local.Burst != 50 {
		t.Errorf("local-only rule: Global = %v, Local = %v; want nil and burst 50", tenant.Global, tenant.Local)
	}
	orders := c.Domain("edge").Match(entries("route=/api/orders", "user_id=u"))
	if g := orders.Global; g == nil || g.Period.Minutes() != 5 || g.Requests != 10 || g.Burst != 10 {
		t.Errorf("orders Global = %+v, want 10 per 5m burst 10", g)
	}
	if got := orders.Source(); got != "test.yaml:18:14" {
		t.Errorf("Source() = %q, want test.yaml:18:14", got)
	}
}

func TestMetricLabel(t *testing.T) {
	t.Parallel()
	d := mustConfig(t, `
domain: d
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        descriptors:
          - key: user
            rate_limit: {unit: minute, requests_per_unit: 60}
  - key: k
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: k
    value: v
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: file
    value: /f/*
    value_to_metric: true
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: a
    value: x
    descriptors:
      - key: b
        value: "*"
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 20}
  - key: t
    value: x*
    share_threshold: true
    descriptors:
      - key: u
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 20}
`).Domain("d")
	tests := []struct {
		name string
		req  []string
		path string
		want string
	}{
		{"value_to_metric level", []string{"route=/users", "method=GET", "user=42"}, "d.route.method.user", "d.route_/users.method.user"},
		{"detailed_metric key-only", []string{"k=other"}, "d.k", "d.k_other"},
		{"detailed_metric empty value", []string{"k="}, "d.k", "d.k"},
		{"exact value", []string{"k=v"}, "d.k_v", "d.k_v"},
		{"wildcard keeps pattern", []string{"path=/api/x"}, "d.path_/api/*", "d.path_/api/*"},
		{"share_threshold keeps pattern under value_to_metric", []string{"file=/f/a"}, "d.file_/f/*", "d.file_/f/*"},
		{"detailed_metric keeps a share_threshold pattern", []string{"t=x1", "u=y"}, "d.t_x*.u", "d.t_x*.u_y"},
		{"detailed_metric shows every level", []string{"a=x", "b=y"}, "d.a_x.b_*", "d.a_x.b_y"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := entries(tt.req...)
			r := d.Match(e)
			if r == nil {
				t.Fatalf("Match(%v) = nil", tt.req)
			}
			if r.Path != tt.path {
				t.Errorf("Path = %q, want %q", r.Path, tt.path)
			}
			if got := r.MetricLabel(e); got != tt.want {
				t.Errorf("MetricLabel(%v) = %q, want %q", tt.req, got, tt.want)
			}
			if got := r.MetricLabel(e[:0]); got != r.Path {
				t.Errorf("MetricLabel(wrong length) = %q, want Path %q", got, r.Path)
			}
		})
	}
}

func TestMetricLabelPlainDoesNotAllocate(t *testing.T) {
	r := mustConfig(t, "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: second, requests_per_unit: 1}}\n").Domain("d").Match(entries("k=v"))
	e := entries("k=v")
	if n := testing.AllocsPerRun(100, func() { r.MetricLabel(e) }); n != 0 {
		t.Errorf("MetricLabel on a plain rule allocates %v times, want 0", n)
	}
}

// rate_limit.consistency sets the rule's Consistency, and Leased; unset
// leaves it to the server (Leased's def), and anything but exact or
// leased is an error.
func TestConsistency(t *testing.T) {
	t.Parallel()
	c := mustConfig(t, `
domain: edge
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 10, consistency: leased}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 10, consistency: exact}
  - key: c
    rate_limit: {unit: second, requests_per_unit: 10}
`)
	for k, want := range map[string]string{"a": "leased", "b": "exact", "c": ""} {
		r := c.Domain("edge").Match(entries(k + "=v"))
		if r.Consistency != want {
			t.Errorf("rule %s: Consistency %q, want %q", k, r.Consistency, want)
		}
		for _, def := range []bool{false, true} {
			if got := r.Leased(def); got != (want == "leased" || want == "" && def) {
				t.Errorf("rule %s: Leased(%v) = %v", k, def, got)
			}
		}
	}
	if got := c.Domain("edge").Match(entries("a=v")).String(); got != "edge.a: global 10/second burst 10, leased" {
		t.Errorf("String() = %q", got)
	}
	_, err := Parse("bad.yaml", []byte("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, consistency: lazy}\n"))
	if err == nil || !strings.Contains(err.Error(), `consistency must be exact or leased, got "lazy"`) {
		t.Errorf("Parse(consistency: lazy) error = %v", err)
	}
}

func TestTenant(t *testing.T) {
	t.Parallel()
	c := mustConfig(t, `
domain: d
descriptors:
  - key: plan
    value: gold
    descriptors:
      - key: tenant
        utilisation: true
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: team
    value: ops-*
    share_threshold: true
    utilisation: true
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 60}
`)
	dom := c.Domain("d")
	for _, tc := range []struct {
		in, tenant string
		opted      bool
	}{
		{"plan=gold,tenant=acme", "acme", true},
		{"team=ops-1", "ops-*", true}, // one shared bucket, one tenant
		{"user=bob", "bob", false},
	} {
		e := entries(strings.Split(tc.in, ",")...)
		r := dom.Match(e)
		if r == nil {
			t.Fatalf("%s: no rule", tc.in)
		}
		if got := r.Tenant(e); got != tc.tenant || r.Utilisation != tc.opted {
			t.Errorf("%s: Tenant = %q, Utilisation = %v; want %q, %v", tc.in, got, r.Utilisation, tc.tenant, tc.opted)
		}
		if got := r.Tenant(e[:len(e)-1]); got != "" {
			t.Errorf("%s: Tenant of a shorter descriptor = %q, want empty", tc.in, got)
		}
		if want := tc.opted; strings.HasSuffix(r.String(), ", utilisation") != want {
			t.Errorf("%s: String() = %q", tc.in, r.String())
		}
	}
}

// rate_limit.share sets the rule's Share; it must lie strictly between 0
// and 1, needs a global limit, and does not combine with charges.
func TestShare(t *testing.T) {
	t.Parallel()
	c := mustConfig(t, `
domain: edge
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 10, share: 0.5}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 10}
`)
	a := c.Domain("edge").Match(entries("a=v"))
	if a.Share != 0.5 || c.Domain("edge").Match(entries("b=v")).Share != 0 {
		t.Errorf("Share: a %v, b %v; want 0.5 and 0", a.Share, c.Domain("edge").Match(entries("b=v")).Share)
	}
	if got := a.String(); got != "edge.a: global 10/second burst 10, share 0.5" {
		t.Errorf("String() = %q", got)
	}
	for in, want := range map[string]string{
		"{unit: second, requests_per_unit: 1, share: 1}":            "share must be a number from 0 to below 1",
		"{unit: second, requests_per_unit: 1, share: -0.5}":         "share must be a number from 0 to below 1",
		"{unit: second, requests_per_unit: 1, share: half}":         "share must be a number from 0 to below 1",
		"{unit: second, requests_per_unit: 1, share: .nan}":         "share must be a number from 0 to below 1",
		"{unlimited: true, share: 0.5}":                             "share needs a global limit",
		"{local: {unit: second, requests_per_unit: 1}, share: 0.5}": "share needs a global limit",
	} {
		_, err := Parse("bad.yaml", []byte("domain: d\ndescriptors:\n  - key: a\n    rate_limit: "+in+"\n"))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%s) error = %v, want %q", in, err, want)
		}
	}
	for _, flag := range []string{"postpaid", "quota_mode"} {
		_, err := Parse("bad.yaml", []byte("domain: d\ndescriptors:\n  - key: a\n    "+flag+": true\n    rate_limit: {unit: second, requests_per_unit: 1, share: 0.5}\n"))
		if err == nil || !strings.Contains(err.Error(), "share does not apply to postpaid or quota_mode rules") {
			t.Errorf("Parse(%s with share) error = %v", flag, err)
		}
	}
}

// The server's default share (--share) goes to every rule that may hold
// shares and sets none; a rule's own share wins, and share: 0 opts out.
func TestShareDefault(t *testing.T) {
	t.Parallel()
	c := mustConfig(t, `
domain: edge
descriptors:
  - key: own
    rate_limit: {unit: second, requests_per_unit: 10, share: 0.5}
  - key: unset
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: off
    rate_limit: {unit: second, requests_per_unit: 10, share: 0}
  - key: postpaid
    postpaid: true
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: quota
    quota_mode: true
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: local
    rate_limit: {local: {unit: second, requests_per_unit: 10}}
  - key: unlimited
    rate_limit: {unlimited: true}
`)
	for key, want := range map[string]uint32{"own": 500000, "unset": 250000, "off": 0, "postpaid": 0, "quota": 0, "local": 0, "unlimited": 0} {
		r := c.Domain("edge").Match(entries(key + "=v"))
		if got := r.ShareMillionths(250000); got != want {
			t.Errorf("%s: ShareMillionths(250000) = %d, want %d", key, got, want)
		}
		if got := r.ShareMillionths(0); key != "own" && got != 0 {
			t.Errorf("%s: ShareMillionths(0) = %d, want 0", key, got)
		}
	}
	if got := c.Domain("edge").Match(entries("off=v")).String(); got != "edge.off: global 10/second burst 10, share 0" {
		t.Errorf("String() = %q", got)
	}
}

// share: 0 survives yaml.Marshal (xDS renders files with it).
func TestShareZeroMarshals(t *testing.T) {
	t.Parallel()
	f, err := Parse("a.yaml", []byte("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, share: 0}\n"))
	if err != nil {
		t.Fatal(err)
	}
	out, err := yaml.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "share: 0") {
		t.Errorf("yaml.Marshal dropped share: 0:\n%s", out)
	}
}
