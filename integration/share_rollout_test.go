//go:build integration

package integration

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rls/sluice/internal/redistest"
)

// TestShareRollout is a rollout of shareRules' `share: 0.5` caught
// midway: node 0 of three built nodes on one redis-server serves the rule
// with it, nodes 1 and 2 without. Nodes 1 and 2 write the key's bucket
// under the whole limit and node 0 under Redis' part, so a share node 0
// held would come on top of the whole limit; the nodes see that their
// rules hold different shares (ratelimit_share_rules_differ) and none
// holds one. Driven at twice the rate, evenly, for 10 s, the fleet admits
// at most burst + rate × T (a share held on node 0: up to f/3 of the limit
// more). The floor is 95% of burst + rate × T': the bucket is written
// under the whole limit throughout. Once nodes 1 and 2 load the rule with
// the share too, every node holds one.
func TestShareRollout(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	withShare, _ := fleetArgs(t, srv, shareRules)
	without, path := fleetArgs(t, srv, strings.ReplaceAll(shareRules, ", share: 0.5", ""))
	nodes := []*rlsProcess{startRLS(t, withShare...), startRLS(t, without...), startRLS(t, without...)}
	for i, p := range nodes {
		pollFor(t, 10*time.Second, fmt.Sprintf("node %d counting 3 live nodes, its rules differing", i), func() bool {
			live, _ := scrapeMetric(t, p, "ratelimit_live_nodes")
			differ, _ := scrapeMetric(t, p, "ratelimit_share_rules_differ")
			return live == 3 && differ == 1
		})
	}
	out := pace(t, nodes, []float64{2 * leaseShared / 3, 2 * leaseShared / 3, 2 * leaseShared / 3}, neverOverTime, request("share", "exact=all"))
	checkNeverOver(t, out, leaseShared, leaseShared)
	checkNoFallback(t, nodes)
	if got := shareAnswers(t, nodes); got != 0 {
		t.Errorf("%.0f decisions answered by a share while the rules differ, want 0", got)
	}

	// The rollout completes: the file of nodes 1 and 2, reloaded on change.
	if err := os.WriteFile(path, []byte(shareRules), 0o600); err != nil {
		t.Fatal(err)
	}
	waitShares(t, nodes)
	for i, p := range nodes {
		if v, _ := scrapeMetric(t, p, "ratelimit_share_rules_differ"); v != 0 {
			t.Errorf("node %d: ratelimit_share_rules_differ %v with the same rules, want 0", i, v)
		}
	}
}
