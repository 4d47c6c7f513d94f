package descriptors

import (
	"strings"
	"testing"
)

// mustParse parses one rule file or fails the test.
func mustParse(t testing.TB, name, yamlText string) *File {
	t.Helper()
	f, err := Parse(name, []byte(yamlText))
	if err != nil {
		t.Fatalf("Parse(%s): %v", name, err)
	}
	return f
}

// mustConfig parses and builds one rule file or fails the test.
func mustConfig(t testing.TB, yamlText string) *Config {
	t.Helper()
	c, err := New([]*File{mustParse(t, "test.yaml", yamlText)}, Options{})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return c
}

// entries builds a descriptor from "k=v" strings.
func entries(kv ...string) []Entry {
	out := make([]Entry, len(kv))
	for i, s := range kv {
		k, v, _ := strings.Cut(s, "=")
		out[i] = Entry{k, v}
	}
	return out
}

type matchCase struct {
	name string
	req  []string
	want string // Path of the matching rule; "" for no match
}

func runMatches(t *testing.T, domain, cfg string, cases []matchCase) {
	t.Helper()
	c := mustConfig(t, cfg)
	d := c.Domain(domain)
	if d == nil {
		t.Fatalf("Domain(%q) = nil", domain)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := d.Match(entries(tc.req...))
			gotPath := ""
			if got != nil {
				gotPath = got.Path
			}
			if gotPath != tc.want {
				t.Errorf("Match(%v) = %q, want %q", tc.req, gotPath, tc.want)
			}
		})
	}
}

// The rule trees of envoyproxy/ratelimit's README examples, matching part.
func TestMatchEnvoyExamples(t *testing.T) {
	t.Parallel()
	t.Run("example1", func(t *testing.T) {
		runMatches(t, "mongo_cps", `
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit: {unit: second, requests_per_unit: 500}
  - key: database
    value: default
    rate_limit: {unit: second, requests_per_unit: 500}
`, []matchCase{
			{"users", []string{"database=users"}, "mongo_cps.database_users"},
			{"default", []string{"database=default"}, "mongo_cps.database_default"},
			{"other value", []string{"database=other"}, ""},
			{"other key", []string{"table=users"}, ""},
		})
	})
	t.Run("example2", func(t *testing.T) {
		runMatches(t, "messaging", `
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
`, []matchCase{
			{"marketing to number", []string{"message_type=marketing", "to_number=2061111111"}, "messaging.message_type_marketing.to_number"},
			{"any number", []string{"to_number=2061111111"}, "messaging.to_number"},
			{"placeholder level alone", []string{"message_type=marketing"}, ""},
			{"other message type", []string{"message_type=alert", "to_number=2061111111"}, ""},
		})
	})
	t.Run("example3", func(t *testing.T) {
		runMatches(t, "edge_proxy_per_ip", `
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
`, []matchCase{
			{"generic ip", []string{"remote_address=50.0.0.1"}, "edge_proxy_per_ip.remote_address"},
			{"black-listed ip", []string{"remote_address=50.0.0.5"}, "edge_proxy_per_ip.remote_address_50.0.0.5"},
		})
	})
	t.Run("example4 one level", func(t *testing.T) {
		runMatches(t, "example4", `
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit: {requests_per_unit: 300, unit: second}
`, []matchCase{
			{"deeper request does not match", []string{"key=value", "subkey=subvalue"}, ""},
			{"same depth", []string{"key=value"}, "example4.key_value"},
		})
	})
	t.Run("example4 two levels", func(t *testing.T) {
		runMatches(t, "example4", `
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit: {requests_per_unit: 300, unit: second}
`, []matchCase{
			{"two levels", []string{"key=value", "subkey=subvalue"}, "example4.key_value.subkey"},
			{"shallower request does not match", []string{"key=value"}, ""},
		})
	})
	t.Run("example5", func(t *testing.T) {
		cfg := `
domain: internal
descriptors:
  - key: ldap
    rate_limit: {unlimited: true}
  - key: azure
    rate_limit: {unit: minute, requests_per_unit: 100}
`
		runMatches(t, "internal", cfg, []matchCase{
			{"unlimited counts as a match", []string{"ldap=x"}, "internal.ldap"},
			{"limited", []string{"azure=x"}, "internal.azure"},
		})
		r := mustConfig(t, cfg).Domain("internal").Match(entries("ldap=x"))
		if !r.Unlimited || r.Global != nil || r.Local != nil {
			t.Errorf("ldap rule = {Unlimited:%v Global:%v Local:%v}, want unlimited without limits", r.Unlimited, r.Global, r.Local)
		}
	})
	t.Run("example6", func(t *testing.T) {
		cfg := `
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit: {requests_per_unit: 10, unit: second}
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit: {requests_per_unit: 20, unit: second}
`
		runMatches(t, "example6", cfg, []matchCase{
			{"user-a", []string{"service=auth-service", "user=user-a"}, "example6.service.user_user-a"},
			{"user-b", []string{"service=auth-service", "user=user-b"}, "example6.service.user_user-b"},
			{"user-c", []string{"service=auth-service", "user=user-c"}, ""},
		})
		d := mustConfig(t, cfg).Domain("example6")
		if r := d.Match(entries("service=s", "user=user-a")); !r.ShadowMode {
			t.Errorf("user-a ShadowMode = false, want true")
		}
		if r := d.Match(entries("service=s", "user=user-b")); r.ShadowMode {
			t.Errorf("user-b ShadowMode = true, want false")
		}
	})
	t.Run("example7", func(t *testing.T) {
		cfg := `
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit: {name: specific_limit, requests_per_unit: 5, unit: second}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
`
		runMatches(t, "example7", cfg, []matchCase{
			{"key_1", []string{"key_1=value_1", "user=bkthomps"}, "example7.key_1_value_1.user_bkthomps"},
			{"key_2", []string{"key_2=value_2", "user=bkthomps"}, "example7.key_2_value_2.user_bkthomps"},
		})
		d := mustConfig(t, cfg).Domain("example7")
		r1 := d.Match(entries("key_1=value_1", "user=bkthomps"))
		r2 := d.Match(entries("key_2=value_2", "user=bkthomps"))
		if r1.Name != "specific_limit" || len(r2.Replaces) != 1 || r2.Replaces[0] != "specific_limit" {
			t.Errorf("Name = %q, Replaces = %q; want specific_limit replaced", r1.Name, r2.Replaces)
		}
	})
	t.Run("example8", func(t *testing.T) {
		runMatches(t, "example8", `
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: key1
    value: value1
    rate_limit: {unit: minute, requests_per_unit: 20}
`, []matchCase{
			{"unspecified value", []string{"key1=unspecified_value"}, "example8.key1"},
			{"value1", []string{"key1=value1"}, "example8.key1_value1"},
		})
	})
	t.Run("example9", func(t *testing.T) {
		runMatches(t, "example9", `
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit: {unit: minute, requests_per_unit: 20}
`, []matchCase{
			{"value_1", []string{"key1=value_1"}, "example9.key1_value*"},
			{"value_2", []string{"key1=value_2"}, "example9.key1_value*"},
			{"bare prefix", []string{"key1=value"}, "example9.key1_value*"},
			{"no prefix", []string{"key1=other"}, ""},
		})
	})
	t.Run("example10 value_to_metric", func(t *testing.T) {
		runMatches(t, "example10", `
domain: example10
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {unit: minute, requests_per_unit: 60}
`, []matchCase{
			{"three levels", []string{"route=/api/v1/users", "http_method=GET", "subject_id=123"}, "example10.route.http_method.subject_id"},
			{"two levels", []string{"route=/api/v1/users", "http_method=GET"}, ""},
		})
	})
	t.Run("example11 share_threshold", func(t *testing.T) {
		runMatches(t, "example11", `
domain: example11
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
`, []matchCase{
			{"a.pdf", []string{"files=files/a.pdf"}, "example11.files_files/*"},
			{"b.csv", []string{"files=files/b.csv"}, "example11.files_files/*"},
			{"other dir", []string{"files=docs/a.pdf"}, ""},
		})
	})
}

func TestMatchSpecificity(t *testing.T) {
	t.Parallel()
	runMatches(t, "d", `
domain: d
descriptors:
  - key: path
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: path
    value: /api/*/orders
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: path
    value: /api/v1/orders
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: path
    value: "*.json"
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: path
    value: /a*
    rate_limit: {unit: second, requests_per_unit: 6}
  - key: path
    value: "*i*"
    rate_limit: {unit: second, requests_per_unit: 7}
  - key: path
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 8}
  - key: user
    rate_limit: {unit: second, requests_per_unit: 9}
`, []matchCase{
		{"exact beats wildcard", []string{"path=/api/v1/orders"}, "d.path_/api/v1/orders"},
		{"first wildcard in file order wins, not the most literal", []string{"path=/api/v2/orders"}, "d.path_/api/*"},
		{"prefix pattern", []string{"path=/api/v1/users"}, "d.path_/api/*"},
		{"leading star", []string{"path=/x.json"}, "d.path_*.json"},
		{"earlier suffix pattern beats later prefix", []string{"path=/a.json"}, "d.path_*.json"},
		{"later prefix pattern when the earlier fail", []string{"path=/abc"}, "d.path_/a*"},
		{"middle star", []string{"path=xiy"}, "d.path_*i*"},
		{"lone star matches anything", []string{"path=zzz"}, "d.path_*"},
		{"lone star matches empty", []string{"path="}, "d.path_*"},
		{"key-only with no wildcard", []string{"user=anything"}, "d.user"},
		{"unknown key", []string{"other=x"}, ""},
		{"empty descriptor", nil, ""},
		{"too deep", []string{"user=a", "user=b"}, ""},
	})
}

func TestMatchWildcardTies(t *testing.T) {
	t.Parallel()
	const cfg = `
domain: d
descriptors:
  - key: k
    value: x*
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: "*y"
    rate_limit: {unit: second, requests_per_unit: 2}
`
	runMatches(t, "d", cfg, []matchCase{
		{"tie goes to file order", []string{"k=xy"}, "d.k_x*"},
		{"only second", []string{"k=ay"}, "d.k_*y"},
	})
	swapped := "domain: d\ndescriptors:\n  - {key: k, value: \"*y\", rate_limit: {unit: second, requests_per_unit: 2}}\n  - {key: k, value: x*, rate_limit: {unit: second, requests_per_unit: 1}}\n"
	runMatches(t, "d", swapped, []matchCase{
		{"tie follows file order when swapped", []string{"k=xy"}, "d.k_*y"},
	})
}

func TestMatchLevels(t *testing.T) {
	t.Parallel()
	runMatches(t, "d", `
domain: d
descriptors:
  - key: route
    value: /a
    rate_limit: {unit: second, requests_per_unit: 1}
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 2}
  - key: route
    descriptors:
      - key: ip
        rate_limit: {unit: second, requests_per_unit: 3}
      - key: ip
        value: 10.*
        descriptors:
          - key: user
            value: "*"
            rate_limit: {unit: second, requests_per_unit: 4}
`, []matchCase{
		{"first level rule", []string{"route=/a"}, "d.route_/a"},
		{"second level", []string{"route=/a", "user=u"}, "d.route_/a.user"},
		{"key-only parent without limit", []string{"route=/b"}, ""},
		{"key-only parent child", []string{"route=/b", "ip=1.2.3.4"}, "d.route.ip"},
		{"no backtracking to key-only parent", []string{"route=/a", "ip=1.2.3.4"}, ""},
		{"three levels through wildcard", []string{"route=/b", "ip=10.0.0.1", "user=u"}, "d.route.ip_10.*.user_*"},
		{"wildcard level without limit", []string{"route=/b", "ip=10.0.0.1"}, ""},
		{"order matters", []string{"user=u", "route=/a"}, ""},
	})
}

func TestMatchNil(t *testing.T) {
	t.Parallel()
	var d *Domain
	if got := d.Match(entries("a=b")); got != nil {
		t.Errorf("nil Domain Match = %v, want nil", got)
	}
	var c *Config
	if c.Domain("x") != nil || c.Len() != 0 || c.Rules() != nil || c.Domains() != nil {
		t.Errorf("nil Config is not empty")
	}
}

// envoyLike is a rule file shaped like an edge proxy's: per-IP, per-route
// per-user, and a path pattern.
const envoyLike = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 1000, burst: 2000, local: {unit: second, requests_per_unit: 3200, burst: 64}}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: route
    value: /api/orders
    descriptors:
      - key: user_id
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: route
    value: /api/*/items/*
    descriptors:
      - key: user_id
        rate_limit: {unit: second, requests_per_unit: 20}
  - key: route
    value: /static/*
    descriptors:
      - key: user_id
        rate_limit: {unit: second, requests_per_unit: 30}
  - key: generic_key
    value: slowpath
    rate_limit: {unit: minute, requests_per_unit: 100}
`

func BenchmarkMatch(b *testing.B) {
	d := mustConfig(b, envoyLike).Domain("edge")
	reqs := [][]Entry{
		entries("remote_address=10.1.2.3"),
		entries("route=/api/v2/items/42", "user_id=alice"),
		entries("generic_key=slowpath"),
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		for _, r := range reqs {
			if d.Match(r) == nil {
				b.Fatal("no match")
			}
		}
	}
}

func TestMatchDoesNotAllocate(t *testing.T) {
	d := mustConfig(t, envoyLike).Domain("edge")
	req := entries("route=/api/v2/items/42", "user_id=alice")
	if n := testing.AllocsPerRun(100, func() { d.Match(req) }); n != 0 {
		t.Errorf("Match allocates %v times per call, want 0", n)
	}
}
