package descriptors

import (
	"encoding/hex"
	"strings"
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
	lim := &bucket.Limit{Requests: 10, Period: time.Second, Burst: 10}
	type in struct {
		name    string
		domain  string
		rule    *Rule
		kind    KeyKind
		entries []Entry
		limit   *bucket.Limit // an Envoy override
	}
	user := d.Match(entries("user=x"))
	ab := d.Match(entries("a=x", "b=y"))
	path := d.Match(entries("path=/api/x"))
	inputs := []in{
		{"base", "d", user, GlobalBucket, entries("user=x"), nil},
		{"other value", "d", user, GlobalBucket, entries("user=y"), nil},
		{"local kind", "d", user, LocalBucket, entries("user=x"), nil},
		{"gray kind", "d", user, GrayLocalBucket, entries("user=x"), nil},
		{"other domain", "e", user, GlobalBucket, entries("user=x"), nil},
		{"exact rule", "d", d.Match(entries("user=admin")), GlobalBucket, entries("user=admin"), nil},
		{"key-only rule, same value", "d", user, GlobalBucket, entries("user=admin"), nil},
		{"no rule", "d", nil, GlobalBucket, entries("user=x"), nil},
		// Envoy overrides: each distinct one its own bucket, apart from the
		// rule's.
		{"override", "d", user, GlobalBucket, entries("user=x"), lim},
		{"override, other requests", "d", user, GlobalBucket, entries("user=x"), &bucket.Limit{Requests: 11, Period: time.Second, Burst: 10}},
		{"override, other period", "d", user, GlobalBucket, entries("user=x"), &bucket.Limit{Requests: 10, Period: time.Minute, Burst: 10}},
		{"override, other burst", "d", user, GlobalBucket, entries("user=x"), &bucket.Limit{Requests: 10, Period: time.Second, Burst: 11}},
		{"override without rule", "d", nil, GlobalBucket, entries("user=x"), lim},
		// Separators inside values must not shift bytes between fields.
		{"two levels a_b", "d", ab, GlobalBucket, entries("a=x_y", "b=z"), nil},
		{"two levels a b_", "d", ab, GlobalBucket, entries("a=x", "b=y_z"), nil},
		{"dot", "d", ab, GlobalBucket, entries("a=x.y", "b=z"), nil},
		{"dot moved", "d", ab, GlobalBucket, entries("a=x", "b=y.z"), nil},
		{"colon", "d", ab, GlobalBucket, entries("a=x:y", "b=z"), nil},
		{"colon moved", "d", ab, GlobalBucket, entries("a=x", "b=y:z"), nil},
		{"braces", "d", ab, GlobalBucket, entries("a={x}", "b=z"), nil},
		{"braces moved", "d", ab, GlobalBucket, entries("a={x", "b=}z"), nil},
		{"length byte in value", "d", ab, GlobalBucket, entries("a=x\x01", "b=z"), nil},
		{"length byte moved", "d", ab, GlobalBucket, entries("a=x", "b=\x01z"), nil},
		{"no rule a_b", "d", nil, GlobalBucket, entries("a_b=c"), nil},
		{"no rule a b_c", "d", nil, GlobalBucket, entries("a=b_c"), nil},
		{"no rule two entries", "d", nil, GlobalBucket, entries("a=b", "c=d"), nil},
		{"no rule joined", "d", nil, GlobalBucket, entries("a=bc=d"), nil},
		{"domain separator", "d.a", nil, GlobalBucket, entries("b=c"), nil},
		{"domain separator moved", "d", nil, GlobalBucket, entries("a.b=c"), nil},
		{"wildcard per value x", "d", path, GlobalBucket, entries("path=/api/x"), nil},
		{"wildcard per value y", "d", path, GlobalBucket, entries("path=/api/y"), nil},
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
	r := d.Match(entries("files=files/a.pdf"))
	ka, _ := BucketKey(nil, "d", r, GlobalBucket, entries("files=files/a.pdf"), nil)
	kb, _ := BucketKey(nil, "d", r, GlobalBucket, entries("files=files/b.csv"), nil)
	if ka != kb {
		t.Errorf("share_threshold keys differ: %x vs %x, want one shared bucket", ka, kb)
	}
	p := d.Match(entries("path=/api/a"))
	pa, _ := BucketKey(nil, "d", p, GlobalBucket, entries("path=/api/a"), nil)
	pb, _ := BucketKey(nil, "d", p, GlobalBucket, entries("path=/api/b"), nil)
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
	req := entries("a=x", "b=y")
	k1, _ := BucketKey(nil, "d", mustConfig(t, keyRules).Domain("d").Match(req), GlobalBucket, req, nil)
	k2, _ := BucketKey(nil, "d", mustConfig(t, reordered).Domain("d").Match(req), GlobalBucket, req, nil)
	if k1 != k2 {
		t.Errorf("key after reload = %x, want unchanged %x", k2, k1)
	}
	const golden = "aa1f1acf61570e7827e025ec3e6ece6b"
	if got := hex.EncodeToString(k1[:]); got != golden {
		t.Errorf("key = %s, want %s: the encoding changed; bump keyVersion and update golden", got, golden)
	}
}

// TestBucketKeyKeepsAcrossLimitChange checks that a rule's buckets are its
// rule and values, not its numbers: a reload that changes requests, unit,
// multiplier or burst keeps the key (the backends convert the bucket), and
// a rule whose match changes does not.
func TestBucketKeyKeepsAcrossLimitChange(t *testing.T) {
	t.Parallel()
	const before = `
domain: d
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 3}
`
	req := entries("user=alice")
	keyOf := func(rules string) bucket.Key {
		t.Helper()
		k, _ := BucketKey(nil, "d", mustConfig(t, rules).Domain("d").Match(req), GlobalBucket, req, nil)
		return k
	}
	k := keyOf(before)
	for _, after := range []string{
		"rate_limit: {unit: day, requests_per_unit: 4}",
		"rate_limit: {unit: hour, requests_per_unit: 3}",
		"rate_limit: {unit: day, unit_multiplier: 2, requests_per_unit: 3}",
		"rate_limit: {unit: day, requests_per_unit: 3, burst: 10}",
	} {
		rules := strings.Replace(before, "rate_limit: {unit: day, requests_per_unit: 3}", after, 1)
		if got := keyOf(rules); got != k {
			t.Errorf("key under %s = %x, want the key under 3/day %x", after, got, k)
		}
	}
	if got := keyOf(strings.Replace(before, "key: user", "key: user\n    value: alice", 1)); got == k {
		t.Errorf("key of an exact rule = %x, the same as the key-only rule's", got)
	}
}

func TestBucketKeyNoAllocs(t *testing.T) {
	d := mustConfig(t, keyRules).Domain("d")
	req := entries("a=x", "b=y")
	r := d.Match(req)
	lim := bucket.Limit{Requests: 1, Period: time.Second, Burst: 1}
	buf := make([]byte, 0, 256)
	for _, o := range []*bucket.Limit{nil, &lim} {
		if n := testing.AllocsPerRun(100, func() { _, buf = BucketKey(buf, "d", r, GlobalBucket, req, o) }); n != 0 {
			t.Errorf("BucketKey(override %v) allocates %v times per call with a reused buf, want 0", o, n)
		}
	}
}

func BenchmarkBucketKey(b *testing.B) {
	d := mustConfig(b, envoyLike).Domain("edge")
	req := entries("route=/api/v2/items/42", "user_id=alice")
	r := d.Match(req)
	var buf []byte
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		_, buf = BucketKey(buf, "edge", r, GlobalBucket, req, nil)
	}
}
