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
		pollFor(t, startTimeout, fmt.Sprintf("node %d counting 3 live nodes, its rules differing", i), func() bool {
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
	changed := time.Now()
	if err := os.WriteFile(path, []byte(shareRules), 0o600); err != nil {
		t.Fatal(err)
	}
	waitShares(t, nodes)
	t.Logf("every node held a share %v after the file of nodes 1 and 2 changed", time.Since(changed).Round(time.Millisecond))
	for i, p := range nodes {
		if v, _ := scrapeMetric(t, p, "ratelimit_share_rules_differ"); v != 0 {
			t.Errorf("node %d: ratelimit_share_rules_differ %v with the same rules, want 0", i, v)
		}
	}
}

// TestShareRolloutRemoved removes shareRules' share on node 0 of three
// holding shares, 3 s into 10 s at twice the rate: node 0 then writes the
// key's bucket under the whole limit while the other two still hold
// their cells of f/3 (⌊f × burst / 3⌋ = 8 tokens refilling at 8.3/s each)
// until their next heartbeat after node 0's, which is sent at once. The
// bound is burst + rate × T plus what those two cells admit meanwhile,
// 2 × (8 + 8.3/s × W), W = 3.5 s: the 2.5 s after which a holder's share
// ends without a heartbeat, and a second for node 0 to see its file
// change and publish. The floor is 95% of Redis' part, (1 − f) × (burst +
// rate × T'): every node writes the bucket at Redis' part or more, at more
// than its rate (measured: 88% of the whole limit, the bucket written
// under both).
func TestShareRolloutRemoved(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	first, path := fleetArgs(t, srv, shareRules)
	others, _ := fleetArgs(t, srv, shareRules)
	nodes := []*rlsProcess{startRLS(t, first...), startRLS(t, others...), startRLS(t, others...)}
	for i, p := range nodes {
		pollFor(t, startTimeout, fmt.Sprintf("node %d counting 3 live nodes", i), func() bool {
			v, _ := scrapeMetric(t, p, "ratelimit_live_nodes")
			return v == 3
		})
	}
	n := waitShares(t, nodes)
	done := make(chan paced, 1)
	go func() {
		done <- pace(t, nodes, []float64{2 * leaseShared / 3, 2 * leaseShared / 3, 2 * leaseShared / 3}, neverOverTime, request("share", "exact=all"))
	}()
	hold(3 * time.Second)
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(shareRules, ", share: 0.5", "")), 0o600); err != nil {
		t.Fatal(err)
	}
	var stopped time.Duration
	for i, p := range nodes {
		stopped = max(stopped, pollFor(t, 10*time.Second, fmt.Sprintf("node %d holding no share", i), func() bool {
			v, _ := scrapeMetric(t, p, "ratelimit_share_nodes")
			return v == 0
		}))
	}
	out := <-done
	t.Logf("every node held no share %v after node 0's file changed", stopped.Round(time.Millisecond))
	cell := float64(int(fleetShare * leaseShared / n))
	elapsed, offered := out.last.Sub(out.first), out.lastSent.Sub(out.first)
	bound := leaseShared + leaseShared*elapsed.Seconds() + 2*(cell+fleetShare*leaseShared/n*3.5)
	checkFleetBound(t, out, 0, bound, 0.95*(1-fleetShare)*(leaseShared+leaseShared*offered.Seconds()))
	checkNoFallback(t, nodes)
}
