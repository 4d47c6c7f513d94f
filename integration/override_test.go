//go:build integration

package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-rls/sluice/internal/redistest"
	"github.com/sluice-rls/sluice/override"
)

const overrideRulesYAML = `domain: edge
descriptors:
  - key: user_id
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: login
    protected: true
    rate_limit: {unit: minute, requests_per_unit: 5}
`

const adminToken = "ops-token-0123456789abcdef"

// adminCall sends one /overrides call to p's admin address with token
// ("": none) and returns the status and body.
func adminCall(t *testing.T, p *rlsProcess, method, path, token, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+p.AdminAddr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// waitFor polls cond every 2 ms until it holds or d passes, and returns
// how long that took; ok false on timeout.
func waitFor(d time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for {
		if cond() {
			return time.Since(start), true
		}
		if time.Since(start) > d {
			return time.Since(start), false
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// overridesHave reports whether p's authenticated admin /overrides lists
// an override whose "effect on scope" contains s (/rlconfig, on the public
// port, shows counts only).
func overridesHave(p *rlsProcess, s string) bool {
	req, err := http.NewRequest("GET", "http://"+p.AdminAddr+"/overrides", nil)
	if err != nil {
		return false
	}
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var l struct {
		Overrides []override.Override `json:"overrides"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		return false
	}
	for _, o := range l.Overrides {
		if strings.Contains(o.Effect()+" on "+o.Scope(), s) {
			return true
		}
	}
	return false
}

// TestOverridesAcrossThreeNodes: three rls serve nodes on one real
// redis-server. An override set on one node's admin endpoint is applied by
// the two others within 1 s (p50/p99 logged), survives a node restart,
// expires on time, and with Redis gone every node keeps the overrides it
// last read and says so in /healthcheck and a metric. Unauthenticated
// calls are refused and protected rules respected.
func TestOverridesAcrossThreeNodes(t *testing.T) {
	t.Parallel()
	redis := redistest.Start(t)
	dir := t.TempDir()
	rules := writeFile(t, dir, "rules.yaml", overrideRulesYAML)
	tokens := writeFile(t, dir, "tokens", "ops:"+adminToken+"\n")
	args := []string{"--config", rules, "--redis", "redis://" + redis.Addr(), "--admin-token-file", tokens}
	nodes := []*rlsProcess{startRLS(t, args...), startRLS(t, args...), startRLS(t, args...)}

	// Unauthenticated or misplaced calls are refused.
	if code, body := adminCall(t, nodes[0], "POST", "/overrides", "", `{"domain":"edge","kind":"shadow","reason":"x"}`); code != http.StatusUnauthorized {
		t.Errorf("POST /overrides without a token: %d %s, want 401", code, body)
	}
	if code, body := adminCall(t, nodes[0], "GET", "/overrides", "wrong-token-0123456789", ""); code != http.StatusUnauthorized {
		t.Errorf("GET /overrides with a wrong token: %d %s, want 401", code, body)
	}
	if code, body := nodes[0].HTTPGet(t, "/overrides"); code != http.StatusNotFound || !strings.Contains(body, "admin address") {
		t.Errorf("GET /overrides on the HTTP port: %d %s, want 404 naming the admin address", code, body)
	}
	// A protected rule is not loosened.
	if code, body := adminCall(t, nodes[0], "POST", "/overrides", adminToken,
		`{"domain":"edge","rule":"edge.login","kind":"allow","reason":"x","expires_in":"1h"}`); code != http.StatusForbidden || !strings.Contains(body, "cannot be bypassed") {
		t.Errorf("allow on a protected rule: %d %s, want 403", code, body)
	}
	if code, body := adminCall(t, nodes[1], "POST", "/overrides", adminToken,
		`{"domain":"edge","rule":"edge.login","kind":"scale","factor":2,"reason":"x"}`); code != http.StatusForbidden {
		t.Errorf("scale ×2 on a protected rule: %d %s, want 403", code, body)
	}

	// Propagation: 15 sets, each on one node, watched on the two others.
	var samples []time.Duration
	for i := range 15 {
		origin := nodes[i%3]
		factor := fmt.Sprintf("%.1f", 1.1+float64(i)/10)
		want := "scale ×" + strings.TrimSuffix(strings.TrimSuffix(factor, "0"), ".")
		start := time.Now()
		code, body := adminCall(t, origin, "POST", "/overrides", adminToken,
			`{"domain":"edge","rule":"edge.user_id","kind":"scale","factor":`+factor+`,"reason":"promotion","expires_in":"1h"}`)
		if code != http.StatusOK {
			t.Fatalf("set on node %d: %d %s", i%3, code, body)
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		for j, n := range nodes {
			if n == origin {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, ok := waitFor(3*time.Second, func() bool { return overridesHave(n, want) })
				d := time.Since(start)
				mu.Lock()
				defer mu.Unlock()
				if !ok {
					t.Errorf("set %d (%s) on node %d: node %d did not apply it within 3 s", i, want, i%3, j)
				}
				samples = append(samples, d)
			}()
		}
		wg.Wait()
	}
	slices.Sort(samples)
	p50, p99 := samples[len(samples)/2], samples[(len(samples)*99+99)/100-1]
	t.Logf("override propagation to the other nodes, %d samples: p50 %v, p99 %v, max %v", len(samples), p50, p99, samples[len(samples)-1])
	if p99 > time.Second {
		t.Errorf("propagation p99 %v, want ≤ 1 s", p99)
	}
	// The last set is ×2.5: every node answers with the scaled limit.
	for j, n := range nodes {
		resp := n.Check(t, "edge", "user_id=alice")
		if got := resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != 25 {
			t.Errorf("node %d: current_limit %d, want 10 × 2.5 = 25", j, got)
		}
	}

	// A block of one value, the worm-key drill: refused everywhere.
	if code, body := adminCall(t, nodes[2], "POST", "/overrides", adminToken,
		`{"domain":"edge","value":"user_id=worm","kind":"block","reason":"leaked key"}`); code != http.StatusOK {
		t.Fatalf("block: %d %s", code, body)
	}
	for j, n := range nodes {
		if _, ok := waitFor(time.Second, func() bool { return n.Check(t, "edge", "user_id=worm").GetOverallCode() == 2 }); !ok {
			t.Errorf("node %d still admits user_id=worm 1 s after the block", j)
		}
	}

	// A restarted node applies the stored overrides from the start.
	nodes[1].Signal(t, syscall.SIGTERM)
	if err := nodes[1].Wait(t, 20*time.Second); err != nil {
		t.Fatalf("node 1 exit: %v", err)
	}
	nodes[1] = startRLS(t, args...)
	if !overridesHave(nodes[1], "scale ×2.5") {
		t.Errorf("restarted node: /overrides lacks the scale:\n%s", func() string { _, b := adminCall(t, nodes[1], "GET", "/overrides", adminToken, ""); return b }())
	}
	if got := nodes[1].Check(t, "edge", "user_id=bob").GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != 25 {
		t.Errorf("restarted node: current_limit %d, want 25", got)
	}

	// Expiry on time: a shadow for 2 s applies, then stops within 1 s of
	// its expiry on every node, without anyone writing.
	code, body := adminCall(t, nodes[0], "POST", "/overrides", adminToken, `{"domain":"edge","kind":"shadow","reason":"drill","expires_in":"2s"}`)
	if code != http.StatusOK {
		t.Fatalf("shadow: %d %s", code, body)
	}
	var set struct {
		Expires time.Time `json:"expires"`
	}
	if err := json.Unmarshal([]byte(body), &set); err != nil {
		t.Fatal(err)
	}
	for j, n := range nodes {
		if _, ok := waitFor(time.Second, func() bool { return overridesHave(n, "shadow on domain edge") }); !ok {
			t.Errorf("node %d never applied the shadow", j)
		}
	}
	for j, n := range nodes {
		if _, ok := waitFor(time.Until(set.Expires)+time.Second, func() bool { return !overridesHave(n, "shadow on domain edge") }); !ok {
			t.Errorf("node %d still applies the shadow 1 s after its expiry", j)
		} else if late := time.Since(set.Expires); late < -50*time.Millisecond {
			t.Errorf("node %d dropped the shadow %v before its expiry", j, -late)
		}
	}

	// Redis gone: every node keeps the last overrides and says so.
	redis.Kill()
	for j, n := range nodes {
		_, ok := waitFor(10*time.Second, func() bool {
			_, hc := n.HTTPGet(t, "/healthcheck")
			_, m := n.HTTPGet(t, "/metrics")
			return strings.Contains(hc, "unreachable") && strings.Contains(m, "ratelimit_override_store_healthy 0")
		})
		if !ok {
			_, hc := n.HTTPGet(t, "/healthcheck")
			t.Errorf("node %d with Redis gone: /healthcheck %q and the metric do not say the store is unreachable", j, hc)
		}
		if !overridesHave(n, "scale ×2.5") || n.Check(t, "edge", "user_id=worm").GetOverallCode() != 2 {
			t.Errorf("node %d with Redis gone dropped its overrides", j)
		}
	}
}

// TestOverrideFileSurvivesRestart: without Redis a node keeps its
// overrides in --override-file and applies them again after a restart;
// without authentication configured /overrides is not served.
func TestOverrideFileSurvivesRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	rules := writeFile(t, dir, "rules.yaml", overrideRulesYAML)
	tokens := writeFile(t, dir, "tokens", "ops:"+adminToken+"\n")
	args := []string{"--config", rules, "--admin-token-file", tokens, "--override-file", dir + "/overrides.json"}
	n := startRLS(t, args...)
	stdout, stderr, code := runRLS(t, "override", "set", "--addr", n.AdminAddr, "--token-file", tokens,
		"--domain", "edge", "--rule", "edge.user_id", "--limit", "3/second", "--reason", "soft landing")
	if code != 0 || !strings.Contains(stdout, "limit 3/second on rule edge.user_id, by ops") {
		t.Fatalf("rls override set: exit %d\n%s%s", code, stdout, stderr)
	}
	n.Signal(t, syscall.SIGTERM)
	if err := n.Wait(t, 20*time.Second); err != nil {
		t.Fatalf("exit: %v", err)
	}
	n = startRLS(t, args...)
	if got := n.Check(t, "edge", "user_id=a").GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != 3 {
		t.Errorf("after the restart: current_limit %d, want the override's 3", got)
	}
	if _, hc := n.HTTPGet(t, "/healthcheck"); !strings.Contains(hc, "overrides: 1 active, store file") {
		t.Errorf("/healthcheck %q, want the override store named", hc)
	}

	off := startRLS(t, "--config", rules)
	if code, body := adminCall(t, off, "GET", "/overrides", adminToken, ""); code != http.StatusNotFound || !strings.Contains(body, "needs authentication") {
		t.Errorf("/overrides without --admin-token-file or mTLS: %d %s, want 404", code, body)
	}
}
