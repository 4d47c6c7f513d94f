package node

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/internal/redistest"
)

// A node on Redis decides a rule with a share from its share once it has
// reached the registry and the share, empty when granted, has refilled:
// requests far below the limit make no Redis call.
func TestServeShares(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()
	rules := "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 6000, share: 0.5}\n"
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	o := testOptions()
	o.Config = dir
	o.Redis, o.RedisTimeout = "redis://"+srv.Addr()+"/0", time.Second
	s := start(t, o)
	metric := func(re string) float64 {
		_, body := httpGet(t, s.HTTP()+"/metrics")
		m := regexp.MustCompile(`(?m)^` + re + ` (\S+)$`).FindStringSubmatch(body)
		if m == nil {
			return -1
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		return v
	}
	deadline := time.Now().Add(10 * time.Second)
	for metric(`ratelimit_share_nodes`) <= 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no share held 10 s after the start:\n%s", s.Log.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The share (3000 tokens at 50 a second) refills 20 tokens in 0.4 s on
	// the node's own clock, which no test can advance.
	time.Sleep(time.Second)
	for i := range 20 {
		resp, err := s.Client().ShouldRateLimit(context.Background(), edgeRequest("user", "u1"))
		if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request %d: %v, %v", i, resp.GetOverallCode(), err)
		}
	}
	if got := metric(`ratelimit_share_decisions_total\{answer="share"\}`); got != 20 {
		t.Errorf("ratelimit_share_decisions_total{answer=share} = %v, want 20", got)
	}
	if got := metric(`ratelimit_memory_buckets\{backend="share"\}`); got != 1 {
		t.Errorf("ratelimit_memory_buckets{backend=share} = %v, want 1", got)
	}
}

// A node publishes the share digest of the rules it decides by in the
// share registry, and a reload's at once.
func TestServeShareDigest(t *testing.T) {
	srv := redistest.Start(t)
	path := filepath.Join(t.TempDir(), "rules.yaml")
	withShare := "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 6000, share: 0.5}\n"
	if err := os.WriteFile(path, []byte(withShare), 0o600); err != nil {
		t.Fatal(err)
	}
	o := testOptions()
	o.Config = path
	o.Redis, o.RedisTimeout = "redis://"+srv.Addr()+"/0", time.Second
	cfg, err := o.Rules.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	want := o.shareDigest(cfg)
	if want == 0 {
		t.Fatal("a rule with a share: digest 0")
	}
	s := start(t, o)
	published := func(d uint64) bool {
		entries, err := srv.Client().HGetAll(context.Background(), "sluice:{nodes}:share").Result()
		if err != nil {
			t.Fatal(err)
		}
		for f, v := range entries {
			if f != "settle" {
				return strings.HasSuffix(v, " "+strconv.FormatUint(d, 16))
			}
		}
		return false
	}
	deadline := time.Now().Add(10 * time.Second)
	for !published(want) {
		if time.Now().After(deadline) {
			t.Fatalf("digest %x not published 10 s after the start:\n%s", want, s.Log.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := os.WriteFile(path, []byte(strings.Replace(withShare, ", share: 0.5", "", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	for !published(0) {
		if time.Now().After(deadline) {
			t.Fatalf("digest 0 not published 10 s after the start, the share removed:\n%s", s.Log.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The standing shares' default is --share in millionths, and none under
// --quota-mode (every rule is then a quota, whose charges land in Redis).
func TestShareDefault(t *testing.T) {
	for _, tc := range []struct {
		share float64
		quota bool
		want  uint32
	}{{0.25, false, 250000}, {0, false, 0}, {0.25, true, 0}} {
		o := Options{Share: tc.share}
		o.QuotaMode = tc.quota
		if got := o.shareDefault(); got != tc.want {
			t.Errorf("--share %v, --quota-mode %v: %d, want %d", tc.share, tc.quota, got, tc.want)
		}
	}
}

// --share is the default a rule's share is resolved with in the share
// digest; under --quota-mode no rule holds one.
func TestShareDigest(t *testing.T) {
	f, err := descriptors.Parse("rules.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 10}\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := descriptors.New([]*descriptors.File{f}, descriptors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := (&Options{}).shareDigest(cfg); got != 0 {
		t.Errorf("no share: digest %x, want 0", got)
	}
	if got, want := (&Options{Share: 0.5}).shareDigest(cfg), cfg.ShareDigest(500_000); got == 0 || got != want {
		t.Errorf("--share 0.5: digest %x, want %x (not 0)", got, want)
	}
	quota := &Options{Share: 0.5}
	quota.QuotaMode = true
	if got := quota.shareDigest(cfg); got != 0 {
		t.Errorf("--share 0.5 --quota-mode: digest %x, want 0", got)
	}
}
