package service_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/go-cmp/cmp"

	"github.com/sluice-rls/sluice/service"
)

const topRules = `
domain: edge
descriptors:
  - key: user_id
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: tenant
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
`

func getTop(t *testing.T, base, query string) service.TopRefusedAnswer {
	t.Helper()
	code, body := get(t, base+"/usage/top?"+query)
	if code != http.StatusOK {
		t.Fatalf("GET /usage/top?%s: %d %s", query, code, body)
	}
	var ans service.TopRefusedAnswer
	if err := json.Unmarshal([]byte(body), &ans); err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
	return ans
}

// TestTopRefusedFromDecisions: refused requests feed the top-K with their
// descriptors' values (gray marker stripped, long values as their digest);
// allowed requests and shadow-mode refusals, which limit nobody, do not.
func TestTopRefusedFromDecisions(t *testing.T) {
	h := newHarness(t, topRules, func(o *service.Options) { o.TopRefused = 4 })
	base := usageServer(t, h)
	long := strings.Repeat("y", service.DefaultMaxValueBytes+1)
	sum := sha256.Sum256([]byte(long))
	for user, n := range map[string]int{"alice": 6, "bob": 3, "carol": 1, long: 2} {
		h.admitted(t, n+1, request("edge", desc("user_id="+user))) // the first is allowed
	}
	// The gray marker is stripped: alice's gray requests count as alice's.
	h.admitted(t, 3, request("edge", desc("user_id=alice", "gray=true")))
	h.admitted(t, 5, request("edge", desc("tenant=t1"))) // shadow: answered OK
	h.admitted(t, 1, request("edge", desc("user_id=dave")))

	want := service.TopRefusedAnswer{K: 4, Minutes: 5, Rules: []service.TopRefusedRule{{
		// 4 distinct values in 4 counters: counted exactly, but the
		// smallest counter (1) bounds what an untracked value may have had.
		Domain: "edge", Rule: "edge.user_id", Refusals: 15, MaxError: 1,
		Values: []service.TopRefusedValue{
			{Value: "user_id=alice", Count: 9, AtLeast: 9},
			{Value: "user_id=bob", Count: 3, AtLeast: 3},
			{Value: "user_id=sha256:" + hex.EncodeToString(sum[:]), Count: 2, AtLeast: 2},
			{Value: "user_id=carol", Count: 1, AtLeast: 1},
		},
	}}}
	got := getTop(t, base, "domain=edge&rule=edge.user_id")
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("/usage/top (-want +got):\n%s", diff)
	}
	if ans := getTop(t, base, "domain=other"); len(ans.Rules) != 0 {
		t.Fatalf("domain=other: %+v, want no rules", ans.Rules)
	}
	// Six minutes on, the windows are gone.
	h.clock.Advance(6 * time.Minute)
	if ans := getTop(t, base, "minutes=5"); len(ans.Rules) != 0 {
		t.Fatalf("six minutes later: %+v, want no rules", ans.Rules)
	}
}

// TestTopRefusedOff: with TopRefused 0 nothing is kept and /usage/top
// says how to turn it on; a bad minutes gets 400.
func TestTopRefusedOff(t *testing.T) {
	h := newHarness(t, topRules)
	base := usageServer(t, h)
	h.admitted(t, 3, request("edge", desc("user_id=alice")))
	code, body := get(t, base+"/usage/top")
	if code != http.StatusNotFound || !strings.Contains(body, "--top-refused 0") {
		t.Fatalf("off: %d %q, want 404 naming --top-refused", code, body)
	}
	h = newHarness(t, topRules, func(o *service.Options) { o.TopRefused = 4 })
	base = usageServer(t, h)
	for _, m := range []string{"0", "6", "x"} {
		if code, body := get(t, base+"/usage/top?minutes="+m); code != http.StatusBadRequest || !strings.Contains(body, "from 1 to 5") {
			t.Errorf("minutes=%s: %d %q, want 400", m, code, body)
		}
	}
	if got := h.call(t, request("edge", desc("user_id=a"))).GetOverallCode(); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("first request: %v", got)
	}
}
