//go:build integration

package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rls/sluice/internal/redistest"
)

// TestLeaseCluster is TestLeaseNeverOver on a real 3-master Redis Cluster,
// the hot bucket's slot migrated (with its key) to another master a second
// into the 3 s run: the nodes' slot maps go stale, their calls reach the
// old master, fail there before writing, and go again slot by slot, which
// go-redis redirects. The fleet still admits no more than burst + rate ×
// T, and at least 95% of it, with no error.
func TestLeaseCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	nodes := leaseNodesOn(t, strings.Join(cl.Addrs(), ","))
	done := make(chan paced, 1)
	go func() {
		done <- pace(t, nodes, []float64{400.0 / 3, 400.0 / 3, 400.0 / 3}, 3*time.Second, request("lease", "shared=all"))
	}()
	hold(time.Second) // the run's first third, on the bucket's first master
	key, slot, from := hotLeaseKey(t, cl)
	to := (from + 1) % 3
	cl.MigrateSlot(slot, to)
	moved := time.Now()
	out := <-done
	t.Logf("%s (slot %d) migrated from master %d to %d, %v after the run's start", key, slot, from, to, moved.Sub(out.first).Round(time.Millisecond))
	checkNeverOver(t, out, 200, 200)

	ctx := context.Background()
	if n, err := cl.Master(to).Client().Exists(ctx, key).Result(); err != nil || n != 1 {
		t.Errorf("%s on its new master: EXISTS = %d, %v; want 1", key, n, err)
	}
	// The old master answered calls built on stale slot maps: MOVED (or
	// ASK, during the migration) to declared keys, and lease.lua's refusal
	// of a key it no longer serves.
	stats, err := cl.Master(from).Client().Info(ctx, "errorstats").Result()
	if err != nil {
		t.Fatalf("INFO errorstats: %v", err)
	}
	t.Logf("old master's errorstats:\n%s", strings.TrimSpace(stats))
	if !strings.Contains(stats, "errorstat_MOVED") && !strings.Contains(stats, "errorstat_ASK") {
		t.Error("no call reached the old master after the slot moved: the run did not exercise stale slot maps")
	}
}

// hotLeaseKey returns the one leased bucket key in cl, its slot and the
// index of the master holding it.
func hotLeaseKey(t *testing.T, cl *redistest.Cluster) (string, int, int) {
	t.Helper()
	ctx := context.Background()
	var found []string
	for i := range cl.Addrs() {
		keys, _, err := cl.Master(i).Client().Scan(ctx, 0, "sluice:lease:*", 1000).Result()
		if err != nil {
			t.Fatalf("SCAN master %d: %v", i, err)
		}
		found = append(found, keys...)
	}
	if len(found) != 1 {
		t.Fatalf("leased bucket keys %v, want one", found)
	}
	slot, err := cl.Master(0).Client().ClusterKeySlot(ctx, found[0]).Result()
	if err != nil {
		t.Fatalf("CLUSTER KEYSLOT: %v", err)
	}
	return found[0], int(slot), cl.MasterOfSlot(int(slot))
}
