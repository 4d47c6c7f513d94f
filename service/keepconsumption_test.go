package service_test

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/ruleset"
	"github.com/sluice-rls/sluice/service"
)

// TestReloadKeepsConsumption edits a rule file's numbers under a running
// server (ruleset.Reloader, as --config and SIGHUP do): a bucket is its rule
// and values, not its numbers, so what a user spent stays spent. A user who
// spent 3 of 3/day gets exactly 1 more at 4/day, in the global layer and the
// local one; lowered to 2/day, a user who spent 2 of 4/day is refused until
// a token refills, 12 hours later.
func TestReloadKeepsConsumption(t *testing.T) {
	const rules = `
domain: d
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: %d}
  - key: tenant
    rate_limit:
      local: {unit: day, requests_per_unit: %d}
`
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	write := func(n int) {
		t.Helper()
		if err := os.WriteFile(path, fmt.Appendf(nil, rules, n, n), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(3)
	cfg, err := ruleset.Load(path, descriptors.Options{})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	store := ruleset.NewStore(cfg)
	r := &ruleset.Reloader{Path: path, Store: store, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	h := newHarness(t, "domain: d", func(o *service.Options) { o.Rules = store })
	reload := func(n int) {
		t.Helper()
		write(n)
		if err := r.Reload(); err != nil {
			t.Fatalf("Reload: %v", err)
		}
	}
	for _, d := range []string{"user=alice", "tenant=acme"} {
		if got := h.admitted(t, 5, request("d", desc(d))); got != 3 {
			t.Fatalf("%s at 3/day: admitted %d of 5, want 3", d, got)
		}
	}
	reload(4)
	for _, d := range []string{"user=alice", "tenant=acme"} {
		if got := h.admitted(t, 5, request("d", desc(d))); got != 1 {
			t.Errorf("%s after 3 of 3/day became 4/day: admitted %d of 5, want exactly 1", d, got)
		}
	}

	// Lowered: bob spends 2 of 4/day, then the file says 2/day.
	if got := h.admitted(t, 2, request("d", desc("user=bob"))); got != 2 {
		t.Fatalf("bob at 4/day: admitted %d of 2, want 2", got)
	}
	reload(2)
	resp := h.call(t, request("d", desc("user=bob")))
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("bob after 2 of 4/day became 2/day: %v, want OVER_LIMIT", resp.GetOverallCode())
	}
	if got, want := resp.GetStatuses()[0].GetDurationUntilReset().AsDuration(), 24*time.Hour; got != want {
		t.Errorf("bob's duration until reset %v, want %v (2 of 2 spent)", got, want)
	}
	h.clock.Advance(12*time.Hour - time.Second)
	if got := h.admitted(t, 1, request("d", desc("user=bob"))); got != 0 {
		t.Errorf("bob a second before a token refills at 2/day: admitted %d, want 0", got)
	}
	h.clock.Advance(time.Second)
	if got := h.admitted(t, 2, request("d", desc("user=bob"))); got != 1 {
		t.Errorf("bob 12 hours after the change to 2/day: admitted %d of 2, want exactly 1", got)
	}
}
