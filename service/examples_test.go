package service_test

import (
	"math"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// The behaviours of envoyproxy/ratelimit's README examples, with
// token-bucket semantics: a limit of N per unit admits N at once (the burst
// defaults to N) and then refills continuously.

func TestExample1KeyValueLimits(t *testing.T) {
	h := newHarness(t, `
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit: {unit: second, requests_per_unit: 500}
  - key: database
    value: default
    rate_limit: {unit: second, requests_per_unit: 500}
`)
	if got := h.admitted(t, 600, request("mongo_cps", desc("database=users"))); got != 500 {
		t.Errorf("database=users admitted %d of 600, want 500", got)
	}
	if got := h.admitted(t, 600, request("mongo_cps", desc("database=default"))); got != 500 {
		t.Errorf("database=default admitted %d of 600, want 500 (own bucket)", got)
	}
	if got := h.admitted(t, 10, request("mongo_cps", desc("database=other"))); got != 10 {
		t.Errorf("database=other (no rule) admitted %d of 10, want 10", got)
	}
}

const messagingRules = `
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
`

func TestExample2NestedAndAggregate(t *testing.T) {
	h := newHarness(t, messagingRules)
	marketing := request("messaging", desc("message_type=marketing", "to_number=2061111111"), desc("to_number=2061111111"))
	if got := h.admitted(t, 10, marketing); got != 5 {
		t.Errorf("marketing to one number admitted %d of 10, want 5", got)
	}
	// Another number has its own buckets.
	if got := h.admitted(t, 10, request("messaging", desc("message_type=marketing", "to_number=2062222222"))); got != 5 {
		t.Errorf("marketing to a second number admitted %d of 10, want 5", got)
	}
	// The overall per-number limit: 5 already taken by marketing, 95 left.
	if got := h.admitted(t, 200, request("messaging", desc("to_number=2061111111"))); got != 95 {
		t.Errorf("to_number alone admitted %d of 200, want 95", got)
	}
	// The aggregate answer is the OR of both descriptors.
	resp := h.call(t, marketing)
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("aggregate code = %v, want OVER_LIMIT", resp.GetOverallCode())
	}
}

func TestExample3MostSpecificWins(t *testing.T) {
	h := newHarness(t, `
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
`)
	if got := h.admitted(t, 20, request("edge_proxy_per_ip", desc("remote_address=50.0.0.1"))); got != 10 {
		t.Errorf("50.0.0.1 admitted %d of 20, want 10", got)
	}
	if got := h.admitted(t, 5, request("edge_proxy_per_ip", desc("remote_address=50.0.0.5"))); got != 0 {
		t.Errorf("blocked 50.0.0.5 admitted %d of 5, want 0", got)
	}
}

func TestExample4LevelExact(t *testing.T) {
	flat := newHarness(t, `
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit: {requests_per_unit: 300, unit: second}
`)
	two := request("example4", desc("key=value", "subkey=subvalue"))
	if st := flat.call(t, two).GetStatuses()[0]; st.GetCurrentLimit() != nil {
		t.Errorf("two entries matched a one-level rule: %v", st)
	}
	nested := newHarness(t, `
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit: {requests_per_unit: 300, unit: second}
`)
	st := nested.call(t, two).GetStatuses()[0]
	if got := st.GetCurrentLimit().GetRequestsPerUnit(); got != 300 {
		t.Errorf("nested rule: current limit %d, want 300", got)
	}
}

func TestExample5Unlimited(t *testing.T) {
	h := newHarness(t, `
domain: internal
descriptors:
  - key: ldap
    rate_limit: {unlimited: true}
  - key: azure
    rate_limit: {unit: minute, requests_per_unit: 100}
`)
	if got := h.admitted(t, 1000, request("internal", desc("ldap=x"))); got != 1000 {
		t.Errorf("unlimited admitted %d of 1000", got)
	}
	st := h.call(t, request("internal", desc("ldap=x"))).GetStatuses()[0]
	if st.GetCode() != rlsv3.RateLimitResponse_OK || st.GetLimitRemaining() != math.MaxUint32 {
		t.Errorf("unlimited status = %v, want OK with limit_remaining MaxUint32", st)
	}
	if got := h.admitted(t, 150, request("internal", desc("azure=x"))); got != 100 {
		t.Errorf("azure admitted %d of 150, want 100", got)
	}
}

func TestExample6ShadowMode(t *testing.T) {
	h := newHarness(t, `
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
`)
	if got := h.admitted(t, 50, request("example6", desc("service=auth-service", "user=user-a"))); got != 50 {
		t.Errorf("shadow user-a admitted %d of 50, want 50", got)
	}
	if got := h.admitted(t, 50, request("example6", desc("service=auth-service", "user=user-b"))); got != 20 {
		t.Errorf("user-b admitted %d of 50, want 20", got)
	}
	shadowed := decisionValue(t, h, "example6", "example6.service.user_user-a", "global", "shadow_mode")
	if shadowed != 40 {
		t.Errorf("shadow_mode decisions = %v, want 40", shadowed)
	}
}

func TestExample7Replaces(t *testing.T) {
	rules := `
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
          replaces: [{name: specific_limit}]
          requests_per_unit: 10
          unit: second
`
	h := newHarness(t, rules)
	both := request("example7", desc("key_1=value_1", "user=bkthomps"), desc("key_2=value_2", "user=bkthomps"))
	if got := h.admitted(t, 20, both); got != 10 {
		t.Errorf("both descriptors admitted %d of 20, want 10 (the 5/s limit replaced)", got)
	}
	// The replaced rule was not counted: its bucket is still full.
	if got := h.admitted(t, 20, request("example7", desc("key_1=value_1", "user=bkthomps"))); got != 5 {
		t.Errorf("key_1 alone admitted %d of 20, want 5", got)
	}
}

func TestExample8DetailedMetric(t *testing.T) {
	h := newHarness(t, `
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: key1
    value: value1
    rate_limit: {unit: minute, requests_per_unit: 20}
`)
	if got := h.admitted(t, 15, request("example8", desc("key1=unspecified_value"))); got != 10 {
		t.Errorf("key1=unspecified_value admitted %d of 15, want 10", got)
	}
	if got := h.admitted(t, 25, request("example8", desc("key1=value1"))); got != 20 {
		t.Errorf("key1=value1 admitted %d of 25, want 20", got)
	}
	over := decisionValue(t, h, "example8", "example8.key1_unspecified_value", "global", "over_limit")
	if over != 5 {
		t.Errorf("detailed over_limit for key1_unspecified_value = %v, want 5", over)
	}
}

func TestExample9Wildcard(t *testing.T) {
	h := newHarness(t, `
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit: {unit: minute, requests_per_unit: 20}
`)
	for _, v := range []string{"value_1", "value_2"} {
		if got := h.admitted(t, 25, request("example9", desc("key1="+v))); got != 20 {
			t.Errorf("key1=%s admitted %d of 25, want 20 (own bucket per value)", v, got)
		}
	}
	if got := h.admitted(t, 25, request("example9", desc("key1=other"))); got != 25 {
		t.Errorf("key1=other (no match) admitted %d of 25, want 25", got)
	}
}

func TestExample10ShareThreshold(t *testing.T) {
	h := newHarness(t, `
domain: example10
descriptors:
  - key: files
    value: /foo/bar/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
`)
	a := h.admitted(t, 8, request("example10", desc("files=/foo/bar/a")))
	b := h.admitted(t, 8, request("example10", desc("files=/foo/bar/b/c")))
	if a != 8 || b != 2 {
		t.Errorf("shared wildcard admitted %d then %d, want 8 then 2 (one bucket of 10)", a, b)
	}
}

func TestExample11ValueToMetric(t *testing.T) {
	h := newHarness(t, `
domain: example11
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: GET
        rate_limit: {unit: second, requests_per_unit: 1}
`)
	h.admitted(t, 3, request("example11", desc("route=/api/a", "http_method=GET")))
	over := decisionValue(t, h, "example11", "example11.route_/api/a.http_method_GET", "global", "over_limit")
	if over != 2 {
		t.Errorf("value_to_metric over_limit for route_/api/a = %v, want 2", over)
	}
}

func TestTokenBucketRefills(t *testing.T) {
	h := newHarness(t, `
domain: d
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 10, burst: 20}
`)
	req := request("d", desc("k=v"))
	if got := h.admitted(t, 30, req); got != 20 {
		t.Fatalf("burst admitted %d of 30, want 20", got)
	}
	h.clock.Advance(300 * time.Millisecond)
	if got := h.admitted(t, 10, req); got != 3 {
		t.Errorf("after 300ms admitted %d, want 3 (10/s refill)", got)
	}
}
