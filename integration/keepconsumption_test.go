//go:build integration

package integration

import (
	"fmt"
	"syscall"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-rls/sluice/internal/redistest"
)

// TestReloadKeepsConsumptionInRedis runs the built binary on a real Redis,
// with the empty-bucket cache on (the default): a user who spent 3 of 3/day
// gets exactly 1 more once the rule file, reloaded on SIGHUP, says 4/day.
// The bucket in Redis keeps its key (its rule and values) and the script
// converts it; the cache, which knew the bucket empty under 3/day, does not
// answer under 4/day.
func TestReloadKeepsConsumptionInRedis(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	dir := t.TempDir()
	rules := func(n int) string {
		return fmt.Sprintf("domain: q\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: %d}\n", n)
	}
	file := writeFile(t, dir, "rules.yaml", rules(3))
	p := startRLS(t, "--redis", "redis://"+s.Addr()+"/0", "--config", file, "--redis-timeout", "500ms")
	admitted := func(n int) int {
		ok := 0
		for range n {
			if p.Check(t, "q", "user=alice").GetOverallCode() == rlsv3.RateLimitResponse_OK {
				ok++
			}
		}
		return ok
	}
	if got := admitted(5); got != 3 {
		t.Fatalf("at 3/day: admitted %d of 5, want 3", got)
	}
	writeFile(t, dir, "rules.yaml", rules(4))
	p.Signal(t, syscall.SIGHUP)
	pollUntil(t, "SIGHUP to reload", func() bool {
		return p.Check(t, "q", "user=nobody").GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() == 4
	})
	if got := admitted(5); got != 1 {
		t.Errorf("after 3 of 3/day became 4/day: admitted %d of 5, want exactly 1", got)
	}
}
