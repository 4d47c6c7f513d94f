package descriptors

import (
	"encoding/hex"
	"testing"
	"time"

	"github.com/sluice-rls/sluice/bucket"
)

const keyRules = `
domain: d
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: user
    value: admin
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: path
    value: /api/*
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: a
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
`

func TestBucketKeyDistinct(t *testing.T) {
	t.Parallel()
	c := mustConfig(t, keyRules)
	d := c.Domain("d")
	lim := bucket.Limit{Requests: 10, Period: time.Second, Burst: 10}
	type in struct {
		name    string
		domain  string
		rule    *Rule
		kind    KeyKind
		entries []Entry
		limit   bucket.Limit
	}
	user := d.Match(entries("user=x"))
	ab := d.Match(entries("a=x", "b=y"))
	path := d.Match(entries("path=/api/x"))
	inputs := []in{
		{"base", "d", user, GlobalBucket, entries("user=x"), lim},
		{"other value", "d", user, GlobalBucket, entries("user=y"), lim},
		{"local kind", "d", user, LocalBucket, entries("user=x"), lim},
		{"gray kind", "d", user, GrayLocalBucket, entries("user=x"), lim},
		{"other domain", "e", user, GlobalBucket, entries("user=x"), lim},
		{"exact rule", "d", d.Match(entries("user=admin")), GlobalBucket, entries("user=admin"), lim},
		{"key-only rule, same value", "d", user, GlobalBucket, entries("user=admin"), lim},
		{"no rule", "d", nil, GlobalBucket, entries("user=x"), lim},
		{"other requests", "d", user, GlobalBucket, entries("user=x"), bucket.Limit{Requests: 11, Period: time.Second, Burst: 10}},
		{"other period", "d", user, GlobalBucket, entries("user=x"), bucket.Limit{Requests: 10, Period: time.Minute, Burst: 10}},
		{"other burst", "d", user, GlobalBucket, entries("user=x"), bucket.Limit{Requests: 10, Period: time.Second, Burst: 11}},
		// Separators inside values must not shift bytes between fields.
		{"two levels a_b", "d", ab, GlobalBucket, entries("a=x_y", "b=z"), lim},
		{"two levels a b_", "d", ab, GlobalBucket, entries("a=x", "b=y_z"), lim},
		{"dot", "d", ab, GlobalBucket, entries("a=x.y", "b=z"), lim},
		{"dot moved", "d", ab, GlobalBucket, entries("a=x", "b=y.z"), lim},
		{"colon", "d", ab, GlobalBucket, entries("a=x:y", "b=z"), lim},
		{"colon moved", "d", ab, GlobalBucket, entries("a=x", "b=y:z"), lim},
		{"braces", "d", ab, GlobalBucket, entries("a={x}", "b=z"), lim},
		{"braces moved", "d", ab, GlobalBucket, entries("a={x", "b=}z"), lim},
		{"length byte in value", "d", ab, GlobalBucket, entries("a=x\x01", "b=z"), lim},
		{"length byte moved", "d", ab, GlobalBucket, entries("a=x", "b=\x01z"), lim},
		{"no rule a_b", "d", nil, GlobalBucket, entries("a_b=c"), lim},
		{"no rule a b_c", "d", nil, GlobalBucket, entries("a=b_c"), lim},
		{"no rule two entries", "d", nil, GlobalBucket, entries("a=b", "c=d"), lim},
		{"no rule joined", "d", nil, GlobalBucket, entries("a=bc=d"), lim},
		{"domain separator", "d.a", nil, GlobalBucket, entries("b=c"), lim},
		{"domain separator moved", "d", nil, GlobalBucket, entries("a.b=c"), lim},
		{"wildcard per value x", "d", path, GlobalBucket, entries("path=/api/x"), lim},
		{"wildcard per value y", "d", path, GlobalBucket, entries("path=/api/y"), lim},
	}
	seen := make(map[bucket.Key]string)
	var buf []byte
	for _, tc := range inputs {
		var k bucket.Key
		k, buf = BucketKey(buf, tc.domain, tc.rule, tc.kind, tc.entries, tc.limit)
		if other, dup := seen[k]; dup {
			t.Errorf("BucketKey(%s) = BucketKey(%s) = %x, want distinct", tc.name, other, k)
		}
		seen[k] = tc.name
	}
}

func TestBucketKeyShareThreshold(t *testing.T) {
	t.Parallel()
	d := mustConfig(t, keyRules).Domain("d")
	lim := bucket.Limit{Requests: 10, Period: time.Hour, Burst: 10}
	r := d.Match(entries("files=files/a.pdf"))
	ka, _ := BucketKey(nil, "d", r, GlobalBucket, entries("files=files/a.pdf"), lim)
	kb, _ := BucketKey(nil, "d", r, GlobalBucket, entries("files=files/b.csv"), lim)
	if ka != kb {
		t.Errorf("share_threshold keys differ: %x vs %x, want one shared bucket", ka, kb)
	}
	p := d.Match(entries("path=/api/a"))
	pa, _ := BucketKey(nil, "d", p, GlobalBucket, entries("path=/api/a"), lim)
	pb, _ := BucketKey(nil, "d", p, GlobalBucket, entries("path=/api/b"), lim)
	if pa == pb {
		t.Errorf("wildcard without share_threshold shares key %x, want one bucket per value", pa)
	}
}

// TestBucketKeyStable checks that keys depend on the rule, not on the load:
// an unchanged rule in a reloaded, reordered, extended file keeps its keys,
// and keys never change across versions (a changed encoding must bump
// keyVersion).
func TestBucketKeyStable(t *testing.T) {
	t.Parallel()
	reordered := `
domain: d
descriptors:
  - key: new_rule
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: a
    descriptors:
      - key: c
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: user
    value: admin
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: user
    rate_limit: {unit: second, requests_per_unit: 10}
`
	lim := bucket.Limit{Requests: 1, Period: time.Second, Burst: 1}
	req := entries("a=x", "b=y")
	k1, _ := BucketKey(nil, "d", mustConfig(t, keyRules).Domain("d").Match(req), GlobalBucket, req, lim)
	k2, _ := BucketKey(nil, "d", mustConfig(t, reordered).Domain("d").Match(req), GlobalBucket, req, lim)
	if k1 != k2 {
		t.Errorf("key after reload = %x, want unchanged %x", k2, k1)
	}
	const golden = "b05ec45168bb938eeb737bdae2b75c1f"
	if got := hex.EncodeToString(k1[:]); got != golden {
		t.Errorf("key = %s, want %s: the encoding changed; bump keyVersion and update golden", got, golden)
	}
}

func TestBucketKeyNoAllocs(t *testing.T) {
	d := mustConfig(t, keyRules).Domain("d")
	req := entries("a=x", "b=y")
	r := d.Match(req)
	lim := bucket.Limit{Requests: 1, Period: time.Second, Burst: 1}
	buf := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() { _, buf = BucketKey(buf, "d", r, GlobalBucket, req, lim) }); n != 0 {
		t.Errorf("BucketKey allocates %v times per call with a reused buf, want 0", n)
	}
}

func BenchmarkBucketKey(b *testing.B) {
	d := mustConfig(b, envoyLike).Domain("edge")
	req := entries("route=/api/v2/items/42", "user_id=alice")
	r := d.Match(req)
	lim := *r.Global
	var buf []byte
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		_, buf = BucketKey(buf, "edge", r, GlobalBucket, req, lim)
	}
}
