//go:build integration

package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-rls/sluice/internal/redistest"
)

// clusterLeaseRules are TestLeaseCluster's leased rules: shared, the hot
// bucket (leaseRules'), and wide, which never refuses in the run and is
// never leased (slower than a token per lease period), so every decision's
// call carries both buckets.
const clusterLeaseRules = `domain: lease
descriptors:
  - key: shared
    rate_limit: {unit: second, requests_per_unit: 50, burst: 50, consistency: leased}
  - key: wide
    rate_limit: {unit: hour, requests_per_unit: 1, burst: 5000, consistency: leased}
`

// TestLeaseCluster is TestLeaseNeverOver on a real 3-master Redis Cluster,
// each request hitting the hot bucket and a wide one on the same master,
// in another slot. A second into the 3 s run the hot bucket's slot
// migrates, with its key, to another master: the nodes' slot maps go
// stale, their calls for the two buckets reach a master that serves only
// one, lease.lua fails there before writing, and the calls go again slot
// by slot, which go-redis redirects (a decision refused by the hot bucket
// then gets its wide token back in a refund call). The fleet still admits
// no more than burst + rate × T of the hot bucket, at least 95% of it, with
// no error; and the wide bucket lost exactly one token per admitted
// request: none taken twice, none refunded twice or kept.
func TestLeaseCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	// A Redis call that timed out would fail the global layer open (its
	// fallback then answers, without Redis' buckets): the test is about
	// stale slot maps, so it gives calls 2 s, far above a loaded machine's
	// lag, and checks that none failed.
	nodes := leaseNodesOn(t, strings.Join(cl.Addrs(), ","), clusterLeaseRules, "--redis-timeout", "2s")
	// Place the buckets: one request each creates its key (a key's first
	// decision leases nothing). The hot one takes half its burst, so that
	// its key outlives the search (a key expires once its bucket is full
	// again), and refills it within 0.5 s, before the run.
	seen := map[string]bool{}
	hot := probeLeaseKey(t, cl, nodes[0], "shared=hot", leaseShared/2, seen)
	var wide leasePlace
	for i := 0; wide.key == "" && i < 50; i++ {
		p := probeLeaseKey(t, cl, nodes[0], fmt.Sprintf("wide=%d", i), 1, seen)
		if p.master == hot.master && p.slot != hot.slot {
			wide = p
		}
	}
	if wide.key == "" {
		t.Fatalf("no wide bucket on master %d beside %s", hot.master, hot.key)
	}
	hold(600 * time.Millisecond)
	done := make(chan paced, 1)
	go func() {
		done <- pace(t, nodes, []float64{2 * leaseShared / 3, 2 * leaseShared / 3, 2 * leaseShared / 3}, 3*time.Second, request("lease", "shared=hot", wide.desc))
	}()
	hold(time.Second) // the run's first third, with the buckets on one master
	to := (hot.master + 1) % 3
	cl.MigrateSlot(hot.slot, to)
	moved := time.Now()
	out := <-done
	// The hot key lives on its new master, checked as soon as the run
	// ends: the bucket is full again (and its key expires) a second after
	// the last take, which the metric scrapes below, on a loaded machine,
	// outlasted (EXISTS = 0 with the key migrated as asked).
	if n, err := cl.Master(to).Client().Exists(context.Background(), hot.key).Result(); err != nil || n != 1 {
		t.Errorf("%s on its new master: EXISTS = %d, %v; want 1", hot.key, n, err)
	}
	t.Logf("%s (slot %d) migrated from master %d to %d, %v after the run's start; %s (slot %d) stays",
		hot.key, hot.slot, hot.master, to, moved.Sub(out.first).Round(time.Millisecond), wide.key, wide.slot)
	checkNeverOver(t, out, leaseShared, leaseShared)
	for i, p := range nodes {
		for _, kind := range []string{"timeout", "connection", "script", "oom", "noperm", "other"} {
			if v, _ := scrapeMetric(t, p, `ratelimit_redis_errors_total{kind="`+kind+`"}`); v != 0 {
				t.Errorf("node %d: ratelimit_redis_errors_total{kind=%q} = %v, want 0", i, kind, v)
			}
		}
	}

	ctx := context.Background()
	// The wide bucket (never leased: every node holds none of it) has 5000
	// less its probe and the admitted requests, plus under a token of
	// refill: a take of that many is allowed, one more is refused.
	left := uint32(5000 - 1 - out.admitted)
	for _, c := range []struct {
		hits uint32
		want rlsv3.RateLimitResponse_Code
	}{{left + 1, rlsv3.RateLimitResponse_OVER_LIMIT}, {left, rlsv3.RateLimitResponse_OK}} {
		req := request("lease", wide.desc)
		req.HitsAddend = c.hits
		r, err := nodes[0].Client.ShouldRateLimit(ctx, req)
		if err != nil || r.GetOverallCode() != c.want {
			t.Errorf("%s × %d after %d admitted: %v, %v; want %v", wide.desc, c.hits, out.admitted, r.GetOverallCode(), err, c.want)
		}
	}
	// The old master answered calls built on stale slot maps: MOVED (or
	// ASK, during the migration) when the hot key routed the call.
	stats, err := cl.Master(hot.master).Client().Info(ctx, "errorstats").Result()
	if err != nil {
		t.Fatalf("INFO errorstats: %v", err)
	}
	t.Logf("old master's errorstats:\n%s", strings.TrimSpace(stats))
	if !strings.Contains(stats, "errorstat_MOVED") && !strings.Contains(stats, "errorstat_ASK") {
		t.Error("no call reached the old master after the slot moved: the run did not exercise stale slot maps")
	}
}

// leasePlace is a leased bucket's key in Redis Cluster.
type leasePlace struct {
	desc   string // the descriptor that hits it
	key    string
	slot   int
	master int
}

// probeLeaseKey sends desc once through p, cost hits, and returns the
// leased bucket key it created (the one not in seen, which it adds).
func probeLeaseKey(t *testing.T, cl *redistest.Cluster, p *rlsProcess, desc string, hits uint32, seen map[string]bool) leasePlace {
	t.Helper()
	req := request("lease", desc)
	req.HitsAddend = hits
	r, err := p.Client.ShouldRateLimit(context.Background(), req)
	if err != nil || r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("%s × %d: %v, %v; want OK", desc, hits, r.GetOverallCode(), err)
	}
	ctx := context.Background()
	var found []string
	for i := range cl.Addrs() {
		keys, _, err := cl.Master(i).Client().Scan(ctx, 0, "sluice:lease:*", 1000).Result()
		if err != nil {
			t.Fatalf("SCAN master %d: %v", i, err)
		}
		for _, k := range keys {
			if !seen[k] {
				found = append(found, k)
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s: new leased bucket keys %v, want one", desc, found)
	}
	seen[found[0]] = true
	slot, err := cl.Master(0).Client().ClusterKeySlot(ctx, found[0]).Result()
	if err != nil {
		t.Fatalf("CLUSTER KEYSLOT: %v", err)
	}
	return leasePlace{desc: desc, key: found[0], slot: int(slot), master: cl.MasterOfSlot(int(slot))}
}
