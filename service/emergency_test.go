package service_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-rls/sluice/emergency"
	"github.com/sluice-rls/sluice/internal/logtest"
	"github.com/sluice-rls/sluice/service"
)

// emergencyRules limit a user to a burst of 3 (global) and an address to a
// burst of 2 (local).
const emergencyRules = `
domain: edge
descriptors:
  - key: user_id
    rate_limit: {unit: minute, requests_per_unit: 3, burst: 3}
  - key: remote_address
    rate_limit:
      local: {unit: minute, requests_per_unit: 2, burst: 2}
  - key: route
    value: /healthz
    rate_limit: {unlimited: true}
`

const (
	goodSecret  = "open-sesame-7f3a"
	wrongSecret = "guess-1234"
)

// withEmergency turns the channel on under key "emergency", accepting
// secrets, and logs every level to sink.
func withEmergency(t *testing.T, secrets service.EmergencySecrets, sink *logtest.Buffer) func(*service.Options) {
	t.Helper()
	return func(o *service.Options) {
		o.EmergencyKey = "emergency"
		o.Emergency = secrets
		o.Logger = slog.New(slog.NewJSONHandler(sink, &slog.HandlerOptions{Level: slog.LevelDebug}))
		o.RefusalLogEvery = 1 // every refusal logged, with its descriptor values
	}
}

func digestsAccepting(t *testing.T, secrets ...string) *emergency.Digests {
	t.Helper()
	var lines []string
	for _, s := range secrets {
		lines = append(lines, emergency.Digest(s))
	}
	d, err := emergency.ParseDigests([]byte(strings.Join(lines, "\n")))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// assertNoSecret fails if the logs or any metric label hold a secret or a
// digest of one.
func assertNoSecret(t *testing.T, h *harness, logs string, secrets ...string) {
	t.Helper()
	families, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var labels strings.Builder
	for _, f := range families {
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				labels.WriteString(lp.GetValue() + "\n")
			}
		}
	}
	for _, s := range secrets {
		for _, leak := range []string{s, emergency.Digest(s), emergency.Digest(s)[:16]} {
			for _, line := range strings.Split(logs, "\n") {
				if strings.Contains(line, leak) {
					t.Errorf("log line holds %q: %s", leak, line)
				}
			}
			if strings.Contains(labels.String(), leak) {
				t.Errorf("a metric label holds %q", leak)
			}
		}
	}
}

// TestEmergencySecretAllows: over gRPC, a request with the right secret is
// allowed on an exhausted rule, takes no token, is counted and logged at
// warn level with the rules it bypassed — never with the secret.
func TestEmergencySecretAllows(t *testing.T) {
	var logs logtest.Buffer
	h := newHarness(t, emergencyRules, withEmergency(t, digestsAccepting(t, "an-older-secret", goodSecret), &logs))
	c := rlsClient(t, h)
	normal := request("edge", desc("user_id=alice"), desc("remote_address=10.0.0.1"))
	for range 2 {
		if resp := rpc(t, c, normal); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("within the limits: %v", resp.GetOverallCode())
		}
	}
	if resp := rpc(t, c, normal); resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("third request: %v, want OVER_LIMIT (local burst 2)", resp.GetOverallCode())
	}
	// The secret in a descriptor of its own, as envoy.yaml's action sends it.
	rescue := request("edge", desc("user_id=alice"), desc("remote_address=10.0.0.1"), desc("emergency="+goodSecret), desc("route=/healthz"))
	for i := range 5 {
		resp := rpc(t, c, rescue)
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("emergency request %d: %v, want OK whatever the limits", i, resp.GetOverallCode())
		}
		for j, st := range resp.GetStatuses() {
			if st.GetCode() != rlsv3.RateLimitResponse_OK {
				t.Errorf("emergency request %d status %d = %v, want OK", i, j, st.GetCode())
			}
		}
	}
	// No token taken: alice still has the third of her global burst of 3.
	if got := h.admitted(t, 2, request("edge", desc("user_id=alice"))); got != 1 {
		t.Errorf("after 5 emergency requests, alice admitted %d of 2, want 1 (emergency requests take no token)", got)
	}
	if got := metricValue(t, h, "ratelimit_emergency_requests_total", map[string]string{"domain": "edge", "result": "allowed"}); got != 5 {
		t.Errorf("emergency allowed = %v, want 5", got)
	}
	out := logs.String()
	var warned int
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "emergency secret: request allowed") {
			warned++
			for _, want := range []string{`"level":"WARN"`, `"domain":"edge"`, `"bypassed_rules":["edge.user_id","edge.remote_address"]`} {
				if !strings.Contains(line, want) {
					t.Errorf("emergency log line lacks %s: %s", want, line)
				}
			}
		}
	}
	if warned != 5 {
		t.Errorf("%d emergency log lines, want one per request (5):\n%s", warned, out)
	}
	assertNoSecret(t, h, out, goodSecret, "an-older-secret")
}

// TestEmergencyWrongSecret: a wrong secret is counted as rejected, the
// request decided as any other, and the entry (stripped) changes no bucket
// key: requests with and without it spend the same bucket.
func TestEmergencyWrongSecret(t *testing.T) {
	var logs logtest.Buffer
	h := newHarness(t, emergencyRules, withEmergency(t, digestsAccepting(t, goodSecret), &logs))
	c := rlsClient(t, h)
	wrong := request("edge", desc("user_id=bob", "emergency="+wrongSecret))
	for range 2 {
		if resp := rpc(t, c, wrong); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("wrong secret within the limit: %v", resp.GetOverallCode())
		}
	}
	if resp := rpc(t, c, request("edge", desc("user_id=bob"))); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("third of bob's burst 3, without the entry: %v", resp.GetOverallCode())
	}
	resp := rpc(t, c, wrong)
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("wrong secret past the limit: %v, want OVER_LIMIT (one bucket with and without the entry)", resp.GetOverallCode())
	}
	// An empty value is no secret either.
	if resp := rpc(t, c, request("edge", desc("user_id=bob"), desc("emergency="))); resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("empty secret: %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	if got := metricValue(t, h, "ratelimit_emergency_requests_total", map[string]string{"domain": "edge", "result": "rejected"}); got != 4 {
		t.Errorf("emergency rejected = %v, want 4", got)
	}
	if got := metricValue(t, h, "ratelimit_emergency_requests_total", map[string]string{"domain": "edge", "result": "allowed"}); got != 0 {
		t.Errorf("emergency allowed = %v, want 0", got)
	}
	out := logs.String()
	if !strings.Contains(out, `"descriptor":"user_id=bob"`) {
		t.Errorf("the refusal log line should show the descriptor without the emergency entry:\n%s", out)
	}
	assertNoSecret(t, h, out, wrongSecret, goodSecret)
}

// TestEmergencyNotInResponseMetadata: the response's dynamic metadata,
// which Envoy's access logs can print, never carries the emergency entry.
func TestEmergencyNotInResponseMetadata(t *testing.T) {
	var logs logtest.Buffer
	h := newHarness(t, emergencyRules, withEmergency(t, digestsAccepting(t, goodSecret), &logs),
		func(o *service.Options) { o.ResponseMetadata = true })
	c := rlsClient(t, h)
	for _, secret := range []string{goodSecret, wrongSecret} {
		resp := rpc(t, c, request("edge", desc("user_id=carol"), desc("emergency="+secret)))
		md := resp.GetDynamicMetadata().String()
		if !strings.Contains(md, "user_id=carol") || strings.Contains(md, secret) || strings.Contains(md, "emergency") {
			t.Errorf("secret %s: dynamic metadata %s, want the descriptors without the emergency entry", secret, md)
		}
	}
}

// TestEmergencyKeyOff: without EmergencyKey the channel is off and the key
// is an ordinary descriptor key, matched by rules like any other.
func TestEmergencyKeyOff(t *testing.T) {
	h := newHarness(t, emergencyRules+`
  - key: emergency
    rate_limit: {unit: minute, requests_per_unit: 1, burst: 1}
`, func(o *service.Options) { o.Emergency = digestsAccepting(t, goodSecret) })
	req := request("edge", desc("emergency="+goodSecret))
	if got := h.admitted(t, 3, req); got != 1 {
		t.Errorf("channel off: admitted %d of 3, want 1 (the rule on key emergency applies)", got)
	}
}

// TestEmergencyRotation rotates the secret of a serving server through
// package emergency's watched file: the new secret works, the old one
// stops, without a restart.
func TestEmergencyRotation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "emergency-digests")
	write := func(secrets ...string) {
		t.Helper()
		var b strings.Builder
		for _, s := range secrets {
			b.WriteString(emergency.Digest(s) + "\n")
		}
		if err := os.WriteFile(path+".new", []byte(b.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(path+".new", path); err != nil {
			t.Fatal(err)
		}
	}
	write("secret-one")
	f, err := emergency.Open(path, emergency.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Watch(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch: %v", err)
		}
	}()
	var logs logtest.Buffer
	h := newHarness(t, emergencyRules, withEmergency(t, f, &logs))
	c := rlsClient(t, h)
	h.admitted(t, 3, request("edge", desc("user_id=dave"))) // exhausted
	allowed := func(secret string) bool {
		return rpc(t, c, request("edge", desc("user_id=dave"), desc("emergency="+secret))).GetOverallCode() == rlsv3.RateLimitResponse_OK
	}
	if !allowed("secret-one") || allowed("secret-two") {
		t.Fatal("before the rotation: want secret-one accepted, secret-two refused")
	}
	write("secret-two")
	deadline := time.Now().Add(5 * time.Second)
	for !allowed("secret-two") {
		if time.Now().After(deadline) {
			t.Fatal("after 5s, the rotated secret is still refused")
		}
		time.Sleep(5 * time.Millisecond) // the watcher reacts to the kernel's events: no clock to move
	}
	if allowed("secret-one") {
		t.Error("after the rotation, the old secret is still accepted")
	}
	assertNoSecret(t, h, logs.String(), "secret-one", "secret-two")
}

// TestEmergencyUnknownDomain: a domain no rule defines is answered OK as
// always; its emergency entry is neither counted (the domain label stays
// bounded by the rules) nor logged.
func TestEmergencyUnknownDomain(t *testing.T) {
	var logs logtest.Buffer
	h := newHarness(t, emergencyRules, withEmergency(t, digestsAccepting(t, goodSecret), &logs))
	for _, secret := range []string{goodSecret, wrongSecret} {
		if resp := h.call(t, request("nowhere", desc("user_id=eve"), desc("emergency="+secret))); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Errorf("unknown domain, secret %s: %v, want OK", secret, resp.GetOverallCode())
		}
	}
	if got := metricValue(t, h, "ratelimit_emergency_requests_total", map[string]string{"domain": "nowhere"}); got != 0 {
		t.Errorf("emergency requests of an unknown domain counted: %v", got)
	}
	if strings.Contains(logs.String(), "emergency secret") {
		t.Errorf("unknown domain logged as an emergency request:\n%s", logs.String())
	}
}
