//go:build integration

package integration

import (
	"encoding/json"
	"net/url"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/internal/redistest"
	"github.com/sluice-rls/sluice/service"
)

// usageRules: a per-tenant global limit slow enough (a token a minute)
// that no refill happens during the test, and a per-node local one.
const usageRules = `domain: fleet
descriptors:
  - key: tenant
    rate_limit:
      unit: hour
      requests_per_unit: 60
      burst: 20
      local: {unit: hour, requests_per_unit: 100}
`

// usageOf reads /usage on p's admin address for one descriptor.
func usageOf(t *testing.T, p *rlsProcess, domain, descriptor string) service.Usage {
	t.Helper()
	code, body := p.AdminGet(t, "/usage?"+url.Values{"domain": {domain}, "descriptor": {descriptor}}.Encode())
	if code != 200 {
		t.Fatalf("/usage on %s: %d %s", p.AdminAddr, code, body)
	}
	var u service.Usage
	if err := json.Unmarshal([]byte(body), &u); err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
	return u
}

// layerOf returns the layer named name of u's first descriptor.
func layerOf(t *testing.T, u service.Usage, name string) service.UsageLayer {
	t.Helper()
	for _, l := range u.Descriptors[0].Layers {
		if l.Layer == name {
			return l
		}
	}
	t.Fatalf("no %s layer in %+v", name, u.Descriptors[0].Layers)
	return service.UsageLayer{}
}

// TestUsageFleetView runs two nodes on one real Redis: tokens taken on A
// show in /usage on B (the global layer is Redis, the fleet), B's local
// layer is its own (untouched), and /usage calls between takes spend
// nothing in Redis.
func TestUsageFleetView(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	rules := writeFile(t, t.TempDir(), "rules.yaml", usageRules)
	args := []string{"--redis", "redis://" + s.Addr() + "/0", "--config", rules, "--redis-timeout", "500ms"}
	a, b := startRLS(t, args...), startRLS(t, args...)

	// Reading a bucket that does not exist writes nothing to Redis.
	if g := layerOf(t, usageOf(t, a, "fleet", "tenant=acme"), "global"); g.Remaining != 20 {
		t.Fatalf("fresh bucket: %+v, want 20 left", g)
	}
	if keys := bucketKeys(t, []*goredis.Client{s.Client()}); len(keys) != 0 {
		t.Fatalf("after /usage of a fresh bucket, Redis holds bucket keys %v, want none", keys)
	}
	for i := range 5 {
		if resp := a.Check(t, "fleet", "tenant=acme"); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("take %d on A: %v", i+1, resp)
		}
		// Reading on both nodes between takes changes nothing.
		for _, p := range []*rlsProcess{a, b} {
			g := layerOf(t, usageOf(t, p, "fleet", "tenant=acme"), "global")
			if g.Remaining != uint64(20-i-1) || g.Source != "redis (the fleet)" {
				t.Fatalf("after take %d, /usage on %s: global %+v, want remaining %d from redis", i+1, p.AdminAddr, g, 20-i-1)
			}
		}
	}
	ub := usageOf(t, b, "fleet", "tenant=acme")
	if l := layerOf(t, ub, "local"); l.Remaining != 100 || l.FullInMS != 0 {
		t.Fatalf("B's local layer: %+v, want full (100): A's takes are A's", l)
	}
	g := layerOf(t, ub, "global")
	// 5 tokens at one a minute: full in 5 minutes, less the test's time.
	if g.FullInMS <= 4*60_000 || g.FullInMS > 5*60_000 {
		t.Fatalf("B's global layer full in %dms, want about 5 minutes", g.FullInMS)
	}
	if l := layerOf(t, usageOf(t, a, "fleet", "tenant=acme"), "local"); l.Remaining != 95 {
		t.Fatalf("A's local layer: remaining %d, want 95", l.Remaining)
	}
	if keys := bucketKeys(t, []*goredis.Client{s.Client()}); len(keys) != 1 {
		t.Fatalf("Redis holds bucket keys %v, want acme's only", keys)
	}
	// The next take, on B, finds the 15 tokens /usage reported.
	resp := b.Check(t, "fleet", "tenant=acme")
	if got := resp.GetStatuses()[0].GetLimitRemaining(); got != 14 {
		t.Fatalf("take on B: remaining %d, want 14", got)
	}

	// rls usage, the built binary, against B.
	out, errOut, code := runRLS(t, "usage", "--addr", b.AdminAddr, "--domain", "fleet", "tenant=acme")
	if code != 0 || !strings.Contains(out, "global: limit 60/hour, burst 20, remaining 14 (30% in use), full in ") || !strings.Contains(out, "[redis (the fleet)]") {
		t.Fatalf("rls usage: exit %d\n%s%s", code, out, errOut)
	}

	// Redis gone: the node's fallback share answers, and /usage says so.
	s.Kill()
	var fb service.UsageLayer
	pollFor(t, startTimeout, "/usage on A answered by the fallback", func() bool {
		u := usageOf(t, a, "fleet", "tenant=acme")
		fb = u.Descriptors[0].Layers[len(u.Descriptors[0].Layers)-1]
		return fb.Layer == "fallback"
	})
	if !strings.HasPrefix(fb.Source, "fallback (Redis is failing") || fb.Error != "" {
		t.Fatalf("fallback layer: %+v", fb)
	}
}
