package service_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-rls/sluice/internal/cputime"
	"github.com/sluice-rls/sluice/override"
	"github.com/sluice-rls/sluice/ruleset"
	"github.com/sluice-rls/sluice/service"
)

const overrideRules = `
domain: edge
descriptors:
  - key: user_id
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: login
    protected: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: local_only
    rate_limit:
      local: {unit: second, requests_per_unit: 4}
`

// overrideHarness is a harness whose Server reads the runtime overrides of
// a Manager on the harness' clock, and a gRPC client to it.
type overrideHarness struct {
	*harness
	mgr    *override.Manager
	rules  *ruleset.Store
	client rlsv3.RateLimitServiceClient
}

func newOverrideHarness(t *testing.T) *overrideHarness {
	t.Helper()
	store, err := override.OpenFile("")
	if err != nil {
		t.Fatal(err)
	}
	oh := &overrideHarness{}
	oh.harness = newHarness(t, overrideRules, func(o *service.Options) {
		oh.rules = o.Rules.(*ruleset.Store)
		oh.mgr = override.NewManager(override.ManagerOptions{Store: store, Rules: o.Rules.Rules, Clock: o.Clock, Resync: time.Hour})
		o.Overrides = oh.mgr
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(s, oh.srv)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	oh.client = rlsv3.NewRateLimitServiceClient(conn)
	return oh
}

// set stores o through the Manager as author "test", failing the test on
// an error.
func (oh *overrideHarness) set(t *testing.T, o override.Override) override.Override {
	t.Helper()
	if o.Reason == "" {
		o.Reason = "test"
	}
	got, err := oh.mgr.Set(context.Background(), o, "test")
	if err != nil {
		t.Fatalf("Set(%+v): %v", o, err)
	}
	return got
}

// grpcAdmitted sends req n times over gRPC and counts OK answers; it
// returns the last response too.
func (oh *overrideHarness) grpcAdmitted(t *testing.T, n int, req *rlsv3.RateLimitRequest) (int, *rlsv3.RateLimitResponse) {
	t.Helper()
	ok := 0
	var last *rlsv3.RateLimitResponse
	for range n {
		resp, err := oh.client.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
			ok++
		}
		last = resp
	}
	return ok, last
}

func TestOverrideEffects(t *testing.T) {
	t.Parallel()
	expires := harnessStart.Add(time.Hour)
	tests := []struct {
		name      string
		overrides []override.Override
		req       *rlsv3.RateLimitRequest
		n         int
		admitted  int
		limit     uint32 // current_limit.requests_per_unit of the last answer
	}{
		{"no override", nil, request("edge", desc("user_id=a")), 20, 10, 10},
		{"scale a rule ×1.5", []override.Override{{Domain: "edge", Rule: "edge.user_id", Kind: override.KindScale, Factor: 1.5, Expires: expires}},
			request("edge", desc("user_id=a")), 20, 15, 15},
		{"scale a domain ×0.6", []override.Override{{Domain: "edge", Kind: override.KindScale, Factor: 0.6}},
			request("edge", desc("user_id=a")), 20, 6, 6},
		{"scale everything ×3", []override.Override{{Kind: override.KindScale, Factor: 3, Expires: expires}},
			request("edge", desc("user_id=a")), 40, 30, 30},
		{"the rule's scale beats the domain's", []override.Override{
			{Domain: "edge", Kind: override.KindScale, Factor: 0.6},
			{Domain: "edge", Rule: "edge.user_id", Kind: override.KindScale, Factor: 2, Expires: expires},
		}, request("edge", desc("user_id=a")), 40, 20, 20},
		{"scale a local-only rule", []override.Override{{Domain: "edge", Rule: "edge.local_only", Kind: override.KindScale, Factor: 2, Expires: expires}},
			request("edge", desc("local_only=x")), 20, 8, 8},
		{"set a limit", []override.Override{{Domain: "edge", Rule: "edge.user_id", Kind: override.KindLimit, Limit: "3/second"}},
			request("edge", desc("user_id=a")), 10, 3, 3},
		{"set a limit for one value", []override.Override{{Domain: "edge", Rule: "edge.user_id", Value: "user_id=a", Kind: override.KindLimit, Limit: "2/second"}},
			request("edge", desc("user_id=a")), 10, 2, 2},
		{"another value keeps the rule's limit", []override.Override{{Domain: "edge", Rule: "edge.user_id", Value: "user_id=a", Kind: override.KindLimit, Limit: "2/second"}},
			request("edge", desc("user_id=b")), 20, 10, 10},
		{"block a value under a rule", []override.Override{{Domain: "edge", Rule: "edge.api_key", Value: "api_key=leaked", Kind: override.KindBlock}},
			request("edge", desc("api_key=leaked")), 5, 0, 0},
		{"block a value in a domain, no rule matching", []override.Override{{Domain: "edge", Value: "tenant=worm", Kind: override.KindBlock}},
			request("edge", desc("tenant=worm")), 5, 0, 0},
		{"a blocked value refuses the request's other descriptors too", []override.Override{{Domain: "edge", Value: "api_key=leaked", Kind: override.KindBlock}},
			request("edge", desc("user_id=a"), desc("api_key=leaked")), 5, 0, 0},
		{"a block does not touch other values", []override.Override{{Domain: "edge", Value: "api_key=leaked", Kind: override.KindBlock}},
			request("edge", desc("api_key=fine")), 6, 4, 4},
		{"allow bypasses a rule", []override.Override{{Domain: "edge", Rule: "edge.user_id", Kind: override.KindAllow, Expires: expires}},
			request("edge", desc("user_id=a")), 30, 30, 0},
		{"allow on a domain skips its protected rules", []override.Override{{Domain: "edge", Kind: override.KindAllow, Expires: expires}},
			request("edge", desc("login=x")), 5, 2, 2},
		{"shadow answers OK", []override.Override{{Domain: "edge", Rule: "edge.user_id", Kind: override.KindShadow, Expires: expires}},
			request("edge", desc("user_id=a")), 30, 30, 10},
		{"scale below 1 applies to a protected rule", []override.Override{{Domain: "edge", Kind: override.KindScale, Factor: 0.5}},
			request("edge", desc("login=x")), 5, 1, 1},
		{"scale above 1 skips a protected rule", []override.Override{{Domain: "edge", Kind: override.KindScale, Factor: 3, Expires: expires}},
			request("edge", desc("login=x")), 10, 2, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			oh := newOverrideHarness(t)
			for _, o := range tt.overrides {
				oh.set(t, o)
			}
			got, last := oh.grpcAdmitted(t, tt.n, tt.req)
			if got != tt.admitted {
				t.Errorf("%d requests: admitted %d, want %d", tt.n, got, tt.admitted)
			}
			var limit uint32
			for _, st := range last.GetStatuses() {
				if l := st.GetCurrentLimit(); l != nil && st.GetCode() == last.GetOverallCode() {
					limit = l.GetRequestsPerUnit()
				}
			}
			if limit != tt.limit {
				t.Errorf("last answer %v: current_limit %d, want %d", last, limit, tt.limit)
			}
		})
	}
}

func TestOverrideProtectedRefusedAtSet(t *testing.T) {
	t.Parallel()
	oh := newOverrideHarness(t)
	for _, o := range []override.Override{
		{Domain: "edge", Rule: "edge.login", Kind: override.KindAllow, Expires: harnessStart.Add(time.Hour), Reason: "r"},
		{Domain: "edge", Rule: "edge.login", Kind: override.KindScale, Factor: 1.5, Reason: "r"},
		{Domain: "edge", Rule: "edge.login", Kind: override.KindLimit, Limit: "100/minute", Reason: "r"},
	} {
		if _, err := oh.mgr.Set(context.Background(), o, "test"); !errors.Is(err, override.ErrProtected) {
			t.Errorf("Set(%s on %s) error = %v, want ErrProtected", o.Effect(), o.Rule, err)
		}
	}
	if got := oh.mgr.List(); len(got) != 0 {
		t.Errorf("after refused sets, List() = %v, want none", got)
	}
	// Tightening a protected rule is fine.
	oh.set(t, override.Override{Domain: "edge", Rule: "edge.login", Kind: override.KindLimit, Limit: "1/minute"})
	if got, _ := oh.grpcAdmitted(t, 3, request("edge", desc("login=x"))); got != 1 {
		t.Errorf("login at 1/minute: admitted %d of 3, want 1", got)
	}
}

// TestOverrideOnRuleThatBecameProtected: an override set before its rule
// was marked protected stops loosening it when the new rules load.
func TestOverrideOnRuleThatBecameProtected(t *testing.T) {
	t.Parallel()
	oh := newOverrideHarness(t)
	oh.set(t, override.Override{Domain: "edge", Rule: "edge.user_id", Kind: override.KindScale, Factor: 3, Expires: harnessStart.Add(time.Hour)})
	if got, _ := oh.grpcAdmitted(t, 40, request("edge", desc("user_id=a"))); got != 30 {
		t.Fatalf("scaled ×3: admitted %d of 40, want 30", got)
	}
	store := oh.rules
	store.Swap(mustRules(t, `
domain: edge
descriptors:
  - key: user_id
    protected: true
    rate_limit: {unit: second, requests_per_unit: 10}
`))
	if got, _ := oh.grpcAdmitted(t, 20, request("edge", desc("user_id=b"))); got != 10 {
		t.Errorf("protected now: admitted %d of 20, want the rule's 10", got)
	}
	if ig := oh.mgr.Table(store.Rules()).Ignored(); len(ig) != 1 {
		t.Errorf("Ignored() = %q, want the scale named", ig)
	}
}

// TestOverrideExpiresOnTime: an override stops applying at its expiry on
// the clock, without a write and without a re-read of the store.
func TestOverrideExpiresOnTime(t *testing.T) {
	t.Parallel()
	oh := newOverrideHarness(t)
	oh.set(t, override.Override{Domain: "edge", Rule: "edge.user_id", Kind: override.KindAllow, Expires: harnessStart.Add(time.Minute)})
	if got, _ := oh.grpcAdmitted(t, 30, request("edge", desc("user_id=a"))); got != 30 {
		t.Fatalf("bypassed: admitted %d of 30, want 30", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); oh.mgr.Run(ctx) }()
	defer func() { cancel(); <-done }()
	// Run waits on a timer for the expiry (the resync is longer here);
	// once it waits, step the fake clock to the expiry and wait until Run
	// waits again, having applied it.
	wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer wcancel()
	if err := oh.clock.BlockUntilContext(wctx, 1); err != nil {
		t.Fatalf("Run never waited: %v", err)
	}
	oh.clock.Advance(time.Minute)
	if err := oh.clock.BlockUntilContext(wctx, 1); err != nil {
		t.Fatalf("Run never waited again: %v", err)
	}
	if tbl := oh.mgr.Table(oh.rules.Rules()); tbl != nil {
		t.Fatalf("at its expiry the override still applies: %v", tbl.Active())
	}
	if got, _ := oh.grpcAdmitted(t, 20, request("edge", desc("user_id=b"))); got != 10 {
		t.Errorf("after expiry: admitted %d of 20, want the rule's 10", got)
	}
}

// BenchmarkShouldRateLimitOverrides is BenchmarkShouldRateLimit's
// sharedkeys/metrics=off request through a Server reading an
// override.Manager: with no override (what every node pays), and with a
// scale on everything plus a block of another value (every rule then
// looked up and re-limited).
func BenchmarkShouldRateLimitOverrides(b *testing.B) {
	for _, bc := range []struct {
		name      string
		overrides []override.Override
	}{
		{"overrides=none", nil},
		{"overrides=scale+block", []override.Override{
			{Kind: override.KindScale, Factor: 0.5, Reason: "bench"},
			{Domain: "edge", Value: "user_id=mallory", Kind: override.KindBlock, Reason: "bench"},
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			store, err := override.OpenFile("")
			if err != nil {
				b.Fatal(err)
			}
			var mgr *override.Manager
			h := newHarness(b, `
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 1000000000
      local: {unit: second, requests_per_unit: 1000000000}
  - key: user_id
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: route
    value: /api/orders*
    descriptors:
      - key: user_id
        rate_limit: {unit: second, requests_per_unit: 1000000000}
`, func(o *service.Options) {
				o.Metrics = nil
				mgr = override.NewManager(override.ManagerOptions{Store: store, Rules: o.Rules.Rules, Clock: o.Clock})
				o.Overrides = mgr
			})
			for _, o := range bc.overrides {
				if _, err := mgr.Set(context.Background(), o, "bench"); err != nil {
					b.Fatal(err)
				}
			}
			req := request("edge", desc("remote_address=10.1.2.3"), desc("user_id=alice"), desc("route=/api/orders/42", "user_id=alice"))
			ctx := context.Background()
			b.ReportAllocs()
			cpu0 := cputime.Process()
			for b.Loop() {
				if _, err := h.srv.ShouldRateLimit(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
			cputime.ReportPerOp(b, cpu0)
		})
	}
}

// TestOverrideScaleKeepsConsumption: a runtime scale changes the limit of
// the rule's own buckets, so what was spent stays spent (the conversion of
// docs/design.md "Buckets and keys"): 10/s spent 10, scaled ×1.5 → exactly
// 5 more on the same clock instant, not a fresh 15.
func TestOverrideScaleKeepsConsumption(t *testing.T) {
	t.Parallel()
	oh := newOverrideHarness(t)
	req := request("edge", desc("user_id=spender"))
	if got, _ := oh.grpcAdmitted(t, 12, req); got != 10 {
		t.Fatalf("before the override: admitted %d of 12, want 10", got)
	}
	oh.set(t, override.Override{Domain: "edge", Rule: "edge.user_id", Kind: override.KindScale, Factor: 1.5, Expires: harnessStart.Add(time.Hour)})
	if got, _ := oh.grpcAdmitted(t, 10, req); got != 5 {
		t.Errorf("after scaling 10/s to 15/s with 10 spent: admitted %d of 10, want exactly 5", got)
	}
}

// TestBlockTellsNoRetry: a blocked value never passes, so its refusal
// carries no retry-after, no x-ratelimit-retry-after-ms and no
// retry_after_ms or reset in the body, as a cost above the burst (on main:
// retry-after 1, and the client back every second).
func TestBlockTellsNoRetry(t *testing.T) {
	t.Parallel()
	oh := newOverrideHarness(t)
	oh.set(t, override.Override{Domain: "edge", Value: "api_key=leaked", Kind: override.KindBlock})
	_, resp := oh.grpcAdmitted(t, 1, request("edge", desc("api_key=leaked")))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("blocked value: %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	for _, k := range []string{"retry-after", "x-ratelimit-retry-after-ms"} {
		if v := headerValue(resp, k); v != "" {
			t.Errorf("header %s: %q, want none", k, v)
		}
	}
	if body := string(resp.GetRawBody()); strings.Contains(body, "retry_after_ms") || strings.Contains(body, "reset") || !strings.Contains(body, `"limit":0`) {
		t.Errorf("body %s: want limit 0 and no retry_after_ms or reset", body)
	}
}
