//go:build integration

package integration

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rls/sluice/internal/redistest"
)

// peerRules holds the quotas of envoyproxy/ratelimit's example rule file
// that its token-quota.sh and multiservice-tokenquota.sh exercise, with the
// same keys, values, limits and metadata.
const peerRules = "testdata/peer/token-quota.yaml"

// TestPeerTokenQuota replays the requests envoyproxy/ratelimit's
// integration scripts token-quota.sh and multiservice-tokenquota.sh make
// its Envoy send (its examples/envoy/proxy.yaml: a check of hits_addend 0
// on the request path, a charge of 1 with apply_on_stream_done once the
// upstream answered) against rls serving the peer's rule file, in memory
// and on a redis-server, exact and leased, and asserts the peer's answers.
// The scripts then wait a minute for the buckets to refill; here the
// refusals' retry-after says they are back within that minute.
func TestPeerTokenQuota(t *testing.T) {
	rules, err := filepath.Abs(peerRules)
	if err != nil {
		t.Fatal(err)
	}
	backends := []struct {
		name  string
		redis string // --consistency with a redis-server; "" in memory
	}{{"memory", ""}, {"redis exact", "exact"}, {"redis leased", "leased"}}
	scripts := []struct {
		name string
		run  func(t *testing.T, p *rlsProcess)
	}{{"token-quota.sh", tokenQuota}, {"multiservice-tokenquota.sh", multiserviceTokenQuota}}
	for _, b := range backends {
		for _, s := range scripts {
			t.Run(b.name+"/"+s.name, func(t *testing.T) {
				args := []string{"--config", rules, "--response-metadata"}
				if b.redis != "" {
					// A fresh redis-server: each script starts from full
					// buckets, as the peer's after its minute's wait.
					r := redistest.Start(t)
					args = append(args, "--redis", "redis://"+r.Addr()+"/0", "--consistency", b.redis, "--redis-timeout", "2s")
				}
				s.run(t, startRLS(t, args...))
			})
		}
	}
}

// tokenQuota replays token-quota.sh: service_2 has 2 a minute (a quota),
// checked with hits_addend 0 and charged 1 when the stream is done.
// Requests 1 to 3 pass (the third finds the quota used up, not overdrawn),
// the fourth is refused.
func tokenQuota(t *testing.T, p *rlsProcess) {
	for n := 1; n <= 4; n++ {
		resp := callRLS(t, p, addend("service=service_2", 0))
		if want := n <= 3; (resp.GetOverallCode() == rlsv3.RateLimitResponse_OK) != want {
			t.Fatalf("request %d: %v, want OK %v (as envoyproxy/ratelimit)", n, resp.GetOverallCode(), want)
		}
		if n == 4 {
			// One token of debt at 2 a minute: back within 30 s.
			retryWithin(t, resp, 30*time.Second)
			break
		}
		// The peer answers the stream-done charge too: OVER_LIMIT once
		// the count is above the limit (request 3's), and records it.
		charge := callRLS(t, p, addend("service=service_2", 1))
		if want := n <= 2; (charge.GetOverallCode() == rlsv3.RateLimitResponse_OK) != want {
			t.Errorf("request %d's charge: %v, want OK %v", n, charge.GetOverallCode(), want)
		}
	}
}

// multiserviceTokenQuota replays multiservice-tokenquota.sh: service_1 (1
// a minute) and service_2 (2 a minute) are quotas, both checked with
// hits_addend 0; Envoy routes to the service the response's metadata
// names (the first rule answered OK: service_with_quota.name) and charges
// that service 1 when the stream is done. Requests 1 and 2 go to
// service_1, 3 to 5 to service_2, and 6 is refused.
func multiserviceTokenQuota(t *testing.T, p *rlsProcess) {
	want := []string{"service_1", "service_1", "service_2", "service_2", "service_2", ""}
	for i, w := range want {
		resp := callRLS(t, p, addend("service=service_1", 0), addend("service=service_2", 0))
		if w == "" {
			if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("request %d: %v, want OVER_LIMIT (every quota in debt)", i+1, resp.GetOverallCode())
			}
			// The sooner quota, service_2's one token of debt: 30 s.
			retryWithin(t, resp, 30*time.Second)
			break
		}
		got := resp.GetDynamicMetadata().GetFields()["metadata"].GetStructValue().GetFields()["service_with_quota"].GetStructValue().GetFields()["name"].GetStringValue()
		if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || got != w {
			t.Fatalf("request %d: %v, routed to %q; want OK, %s (as envoyproxy/ratelimit)", i+1, resp.GetOverallCode(), got, w)
		}
		callRLS(t, p, addend("service="+got, 1))
	}
}

// addend is a descriptor ("k=v") with its hits_addend set, as Envoy sends
// a rate limit configured with hits_addend.
func addend(entry string, n uint64) *commonv3.RateLimitDescriptor {
	d := request("", entry).GetDescriptors()[0]
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

// callRLS sends one request of domain rl, the peer example's, with descs.
func callRLS(t *testing.T, p *rlsProcess, descs ...*commonv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := p.Client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "rl", Descriptors: descs})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// retryWithin checks that a refusal's x-ratelimit-retry-after-ms is
// positive and at most d.
func retryWithin(t *testing.T, resp *rlsv3.RateLimitResponse, d time.Duration) {
	t.Helper()
	for _, h := range resp.GetResponseHeadersToAdd() {
		if h.GetKey() == "x-ratelimit-retry-after-ms" {
			ms, err := strconv.Atoi(h.GetValue())
			if err != nil || ms <= 0 || time.Duration(ms)*time.Millisecond > d {
				t.Errorf("retry after %q ms, want within %v", h.GetValue(), d)
			}
			return
		}
	}
	t.Errorf("refusal without x-ratelimit-retry-after-ms: %v", resp.GetResponseHeadersToAdd())
}
