package main

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-rls/sluice/internal/redistest"
	"github.com/sluice-rls/sluice/service"
)

// TestUsageShares: `rls serve --share 0.5` on a real redis-server gives
// the rule that sets no share half of its limit as standing shares, and
// not the rule with share: 0; /usage on the admin address, and rls usage,
// say Redis' part and this node's cell apart: three requests of the
// shared rule took from the cell, none from Redis. A cell starts empty
// when its node is granted a share, so the test waits until it has
// refilled (a per-second rule: a second at most).
func TestUsageShares(t *testing.T) {
	srv := redistest.Start(t)
	rules := writeRuleFile(t, t.TempDir(), "rules.yaml", `domain: edge
descriptors:
  - key: user_id
    rate_limit: {unit: second, requests_per_unit: 600}
  - key: route
    rate_limit: {unit: hour, requests_per_unit: 600, share: 0}
`)
	line := serveInProcess(t, noEnv, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
		"--log-format", "json", "--config", rules, "--redis", "redis://"+srv.Addr()+"/0", "--consistency", "exact", "--share", "0.5").Serving()
	admin, grpcAddr := line["admin_addr"].(string), line["grpc_addr"].(string)
	usage := func(args ...string) string {
		t.Helper()
		code, out, errOut := runRLS(t, nil, append([]string{"usage", "--addr", admin, "--domain", "edge"}, args...)...)
		if code != 0 {
			t.Fatalf("rls usage %v: exit %d, stderr %s", args, code, errOut)
		}
		return out
	}
	// The node holds shares once every live node counts it (one client:
	// rls usage would open a connection per call).
	read := func(query string) service.Usage {
		t.Helper()
		resp, err := http.Get("http://" + admin + "/usage?domain=edge&" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var u service.Usage
		if err := json.NewDecoder(resp.Body).Decode(&u); err != nil {
			t.Fatalf("GET /usage: %s: %v", resp.Status, err)
		}
		return u
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		u := read("descriptor=user_id%3Dalice")
		if sh := u.Descriptors[0].Layers[0].Share; sh != nil && sh.Nodes > 0 && sh.Remaining == sh.Limit.Burst {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no full share held 10 s after the start: %+v", u)
		}
		time.Sleep(10 * time.Millisecond)
	}

	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	for range 3 {
		for _, req := range []*rlsv3.RateLimitRequest{edgeRequest("user_id", "alice"), edgeRequest("route", "/a")} {
			if resp, err := client.ShouldRateLimit(context.Background(), req); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				t.Fatalf("%v: %v, %v", req, resp.GetOverallCode(), err)
			}
		}
	}

	u := read("descriptor=user_id%3Dalice&descriptor=route%3D%2Fa")
	shared, own := u.Descriptors[0].Layers[0], u.Descriptors[1].Layers[0]
	half := service.UsageLimit{RequestsPerUnit: 600, Unit: "second", UnitMultiplier: 2, Burst: 300} // 300/second
	// The cell refills 3 tokens in 10ms: what it answered is counted.
	if shared.Share == nil || shared.Limit != half || shared.Remaining != 300 ||
		shared.Share.Fraction != 0.5 || shared.Share.Nodes != 1 || shared.Share.Limit != half || shared.Share.Remaining < 297 {
		t.Errorf("user_id=alice: global layer %+v, share %+v; want Redis' part and the cell each 300/second, burst 300, 300 and 297 or more left, n 1", shared, shared.Share)
	}
	if _, body := httpGet(t, "http://"+line["http_addr"].(string)+"/metrics"); !regexp.MustCompile(`(?m)^ratelimit_share_decisions_total\{answer="share"\} 3$`).MatchString(body) {
		t.Errorf("/metrics: want 3 calls answered by the share alone:\n%s", regexp.MustCompile(`(?m)^ratelimit_share_decisions_total.*$`).FindAllString(body, -1))
	}
	if own.Share != nil || own.Limit != (service.UsageLimit{RequestsPerUnit: 600, Unit: "hour", Burst: 600}) || own.Remaining != 597 {
		t.Errorf("route=/a (share: 0): global layer %+v, share %+v; want the whole limit in Redis, 597 left", own, own.Share)
	}

	// Full-in times and the cell's tokens move with the real clock.
	full := regexp.MustCompile(`full in [0-9.]+m?s`)
	got := full.ReplaceAllString(usage("user_id=alice", "route=/a"), "full in T")
	got = regexp.MustCompile(`burst 300, remaining 29[7-9] \(1% in use\)|burst 300, remaining 300 \(0% in use\), full in T \[memory`).ReplaceAllStringFunc(got, func(m string) string {
		if strings.HasSuffix(m, "[memory") {
			return "burst 300, remaining R, full in T [memory"
		}
		return "burst 300, remaining R"
	})
	want := `domain edge
  user_id=alice: rule edge.user_id
    global: Redis' part limit 600/2 seconds, burst 300, remaining 300 (0% in use), full in T [redis (the fleet)]
      share 0.5 of the limit over the nodes: this node's cell (1 of 1) limit 600/2 seconds, burst 300, remaining R, full in T [memory (this node)]
  route=/a: rule edge.route
    global: limit 600/hour, burst 600, remaining 597 (0% in use), full in T [redis (the fleet)]
`
	if got != want {
		t.Errorf("rls usage printed:\n%s\nwant:\n%s", got, want)
	}
}
