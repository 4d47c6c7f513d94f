//go:build integration

package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

const aclRulesYAML = `domain: edge
descriptors:
  - key: user_id
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1000, consistency: leased}
`

// TestDocumentedACLCoversOverridesAndAudit runs a node as exactly the
// least-privilege user of docs/redis.md (parsed from the doc, so the doc
// and the test cannot drift): exact and leased global decisions, node
// heartbeats, runtime overrides (set, list, rm, the change channel, the
// restore after a FLUSHALL) and the audit stream all work, and Redis refuses it nothing. Under the
// ACL documented before, overrides answered 503 (no HGETALL, HSET, HDEL,
// MULTI, PUBLISH, SUBSCRIBE, channels) and audit writes failed (no XADD).
func TestDocumentedACLCoversOverridesAndAudit(t *testing.T) {
	t.Parallel()
	// docs/production.md's copy is the same line.
	var words []string
	for _, w := range documentedACL(t) {
		words = append(words, fmt.Sprint(w))
	}
	acl := strings.Join(words, " ")
	prod, err := os.ReadFile("../docs/production.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(prod), acl+"\n") {
		t.Errorf("docs/production.md lacks redis.md's ACL line %q", acl)
	}
	s, admin := startACLRedis(t)
	dir := t.TempDir()
	rules := writeFile(t, dir, "rules.yaml", aclRulesYAML)
	tokens := writeFile(t, dir, "tokens", "ops:"+adminToken+"\n")
	p := startRLS(t, "--config", rules, "--redis", "redis://sluice:s3cret@"+s.Addr()+"/0", "--admin-token-file", tokens)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Decisions: exact (Redis decides each) and leased.
	for i := range 3 {
		if r := p.Check(t, "edge", "user_id=alice"); r.GetOverallCode() != 1 {
			t.Fatalf("exact decision %d: %v, want OK", i, r)
		}
		if r := p.Check(t, "edge", "tenant=acme"); r.GetOverallCode() != 1 {
			t.Fatalf("leased decision %d: %v, want OK", i, r)
		}
	}
	pollFor(t, 10*time.Second, "ratelimit_live_nodes 1 (heartbeats as the ACL user)", func() bool {
		return metricIs(t, p, "ratelimit_live_nodes", 1)
	})

	// Overrides: the node subscribed to the change channel, set, list, rm.
	pollFor(t, 10*time.Second, "a subscriber on sluice:overrides:changed", func() bool {
		n, err := admin.PubSubNumSub(ctx, "sluice:overrides:changed").Result()
		return err == nil && n["sluice:overrides:changed"] >= 1
	})
	code, body := adminCall(t, p, "POST", "/overrides", adminToken, `{"domain":"edge","value":"user_id=worm","kind":"block","reason":"leaked key"}`)
	if code != http.StatusOK {
		t.Fatalf("set as the ACL user: %d %s", code, body)
	}
	var set struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(body), &set); err != nil {
		t.Fatal(err)
	}
	if r := p.Check(t, "edge", "user_id=worm"); r.GetOverallCode() != 2 {
		t.Errorf("user_id=worm after the block: %v, want OVER_LIMIT", r)
	}
	if code, body := adminCall(t, p, "GET", "/overrides", adminToken, ""); code != http.StatusOK || !strings.Contains(body, set.ID) || !strings.Contains(body, `"store_healthy": true`) {
		t.Errorf("list as the ACL user: %d %s", code, body)
	}
	// Redis loses everything: the node writes its overrides back (the
	// restore script, as this user).
	if err := admin.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	pollFor(t, 10*time.Second, "the block restored to sluice:overrides", func() bool {
		return admin.HExists(ctx, "sluice:overrides", set.ID).Val()
	})
	if code, body := adminCall(t, p, "DELETE", "/overrides/"+set.ID, adminToken, ""); code != http.StatusOK {
		t.Errorf("rm as the ACL user: %d %s", code, body)
	}

	// The audit stream: set and remove are in it, nothing failed.
	pollFor(t, 10*time.Second, "override.restore and override.remove in sluice:audit", func() bool {
		msgs, err := admin.XRange(ctx, "sluice:audit", "-", "+").Result()
		if err != nil {
			return false
		}
		var kinds []string
		for _, m := range msgs {
			if k, ok := m.Values["kind"].(string); ok {
				kinds = append(kinds, k)
			}
		}
		all := strings.Join(kinds, " ")
		return strings.Contains(all, "override.restore") && strings.Contains(all, "override.remove")
	})
	for _, series := range []string{
		`ratelimit_audit_stream_events_total{result="failed"}`,
		"ratelimit_fallback_active",
	} {
		if v, ok := scrapeMetric(t, p, series); ok && v != 0 {
			t.Errorf("%s = %v, want 0", series, v)
		}
	}
	if log := p.Log(); strings.Contains(log, "NOPERM") || strings.Contains(log, "no permissions") {
		t.Errorf("Redis refused the documented user a command:\n%s", log)
	}
}
