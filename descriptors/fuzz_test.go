package descriptors

import (
	"errors"
	"testing"
	"time"

	"github.com/sluice-rls/sluice/bucket"
)

// FuzzParse checks that Parse never panics, that every error is a list of
// *Error, and that a file that parses survives a yaml.Marshal round trip,
// builds, and matches without panicking. Seeds: testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	f.Add([]byte(envoyLike))
	f.Add([]byte(keyRules))
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse("fuzz.yaml", data)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Parse error %T (%v) is not an *Error", err, err)
			}
			return
		}
		checkRoundTrip(t, file)
		c, err := New([]*File{file}, Options{})
		if err != nil {
			return // cross-file checks (replaces, path collisions) may fail
		}
		d := c.Domain(file.Domain)
		for _, r := range c.Rules() {
			_ = r.String()
			req := make([]Entry, r.Levels())
			allExact := true
			for i, l := range r.levels {
				req[i] = Entry{Key: l.key, Value: l.value}
				allExact = allExact && l.kind == exact
			}
			// A pattern or empty value may also match a more specific
			// wildcard, so only exact paths must find their own rule.
			if got := d.Match(req); allExact && got != r {
				t.Errorf("Match(%v) = %v, want %s", req, got, r.Path)
			}
			_ = r.MetricLabel(req)
			_, _ = BucketKey(nil, r.Domain, r, GlobalBucket, req, nil)
		}
	})
}

// FuzzBucketKey checks that distinct inputs get distinct keys and that a
// reused buffer gives the same key as a fresh one. Seeds:
// testdata/fuzz/FuzzBucketKey.
func FuzzBucketKey(f *testing.F) {
	f.Add("d", "a", "b_c", "", "", uint8(1), "d", "a_b", "c", "", "", uint8(1), uint8(1), uint64(10))
	f.Add("d", "a", "b", "c", "d", uint8(2), "d", "a", "b", "c", "d", uint8(2), uint8(2), uint64(10))
	f.Add("d.a", "b", "c", "", "", uint8(1), "d", "a.b", "c", "", "", uint8(1), uint8(3), uint64(0))
	c := mustConfig(f, `
domain: d
descriptors:
  - key: a
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 1}
`)
	rule := c.Domain("d").Match([]Entry{{"a", ""}, {"b", ""}})
	f.Fuzz(func(t *testing.T, d1, k1, v1, k2, v2 string, n1 uint8, d2, k3, v3, k4, v4 string, n2 uint8, kind uint8, req uint64) {
		build := func(k, v, kk, vv string, n uint8) []Entry {
			e := []Entry{{k, v}, {kk, vv}}
			return e[:n%3]
		}
		e1, e2 := build(k1, v1, k2, v2, n1), build(k3, v3, k4, v4, n2)
		var lim *bucket.Limit
		if req%2 == 1 { // every other input with an override's numbers
			lim = &bucket.Limit{Requests: req, Period: time.Second, Burst: req}
		}
		for _, r := range []*Rule{nil, rule} {
			a, buf := BucketKey(nil, d1, r, KeyKind(kind), e1, lim)
			a2, _ := BucketKey(append(buf[:0], "garbage"...), d1, r, KeyKind(kind), e1, lim)
			if a != a2 {
				t.Fatalf("BucketKey with a reused buffer = %x, want %x", a2, a)
			}
			if lim != nil {
				if c, _ := BucketKey(nil, d1, r, KeyKind(kind), e1, nil); c == a {
					t.Fatalf("BucketKey with override %+v = %x, the same as without one", *lim, a)
				}
			}
			b, _ := BucketKey(nil, d2, r, KeyKind(kind), e2, lim)
			same := d1 == d2 && len(e1) == len(e2)
			for i := range min(len(e1), len(e2)) {
				same = same && e1[i] == e2[i]
			}
			if same != (a == b) {
				t.Fatalf("BucketKey(%q, %q) = %x, BucketKey(%q, %q) = %x; equal keys = %v, want %v",
					d1, e1, a, d2, e2, b, a == b, same)
			}
			if len(a) != 16 {
				t.Fatalf("key length %d, want 16", len(a))
			}
		}
	})
}
