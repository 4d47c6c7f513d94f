package redis

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/internal/redistest"
)

// scriptHit is one key of a token_bucket.lua call: period, requests,
// burst, cost and flags, as the script reads them.
type scriptHit struct{ period, requests, burst, cost, flags uint64 }

func (h scriptHit) args() []uint64 {
	return []uint64{h.period, h.requests, h.burst, h.cost, h.flags}
}

// TestScriptInline checks that token_bucket.lua's in-line path (a decision
// of one key, or of takes on distinct buckets) decides exactly as its
// general path. Each trial gives buckets X1..X3 and Y1..Y3 the same values
// (missing, a foreign value, or a recorded TAT, expiry and limit around
// Redis' now, under the hits' limit or another), then one call runs the
// same decisions on the Xs, in line, and on the Ys, each with an
// independent check of a full bucket W added (never refused, never
// written), which sends it down the general path. Decisions are one hit
// of any kind, often the one before again (a hot key's batch), or takes on
// two or three buckets. Both halves see the same now, so their replies and
// the values left in Xi and Yi must be byte-equal.
func TestScriptInline(t *testing.T) {
	t.Parallel()
	c := redistest.Start(t).Client()
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 13))
	pick := func(v ...uint64) uint64 { return v[rng.IntN(len(v))] }
	randHit := func(flags uint64) scriptHit {
		return scriptHit{
			period:   pick(1, 7, 1_000_000, 3_600_000_000),
			requests: pick(0, 1, 3, 10, 1000, 1<<40),
			burst:    pick(0, 1, 5, 1000, 1<<40),
			cost:     pick(0, 1, 2, 7, 1<<41),
			flags:    flags,
		}
	}
	check := scriptHit{period: 1_000_000, requests: 1, burst: 1, cost: 0, flags: flagIndependent}
	const buckets = 3
	for trial := range 400 {
		tm, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		now := float64(tm.UnixMicro())
		var decisions [][]hitOn[scriptHit]
		for range 1 + rng.IntN(8) {
			switch last := len(decisions) - 1; {
			case last >= 0 && len(decisions[last]) == 1 && rng.IntN(2) == 0:
				decisions = append(decisions, decisions[last]) // a hot key's batch
			case rng.IntN(2) == 0:
				decisions = append(decisions, []hitOn[scriptHit]{{rng.IntN(buckets), randHit(pick(0, 0, 1, 2, 3, 6))}})
			default:
				var d []hitOn[scriptHit]
				for _, b := range rng.Perm(buckets)[:2+rng.IntN(buckets-1)] {
					d = append(d, hitOn[scriptHit]{b, randHit(0)})
				}
				decisions = append(decisions, d)
			}
		}
		key := func(side string, b int) string { return fmt.Sprintf("inline/%d/%s%d", trial, side, b) }
		values := make([][]byte, buckets)
		for b := range buckets {
			var value []byte
			switch rng.IntN(4) {
			case 0: // missing
			case 1:
				value = []byte("16 bytes, old  ")
			default:
				h := randHit(0)
				interval := float64(max(h.period, 1)) / float64(max(h.requests, 1))
				iv, bu := interval, float64(h.burst)
				tat := now + (rng.Float64()*2-0.5)*iv*max(bu, 1)
				for _, f := range []float64{tat, math.Floor(tat/1000) + float64(pick(0, 1, 5000)), iv, bu} {
					value = binary.LittleEndian.AppendUint64(value, math.Float64bits(f))
				}
			}
			values[b] = value
		}
		bothPaths(t, c, tokenBucketLua, replyBytes, trial, decisions, check, key, values, getBoth)
	}
}

// hitOn is one op of an in-line equivalence trial: hit, on the trial's
// bucket number bucket.
type hitOn[H interface{ args() []uint64 }] struct {
	bucket int
	hit    H
}

// bothPaths runs one trial of an in-line equivalence test (TestScriptInline,
// TestLeaseInline) in one call of script: each bucket b holds values[b]
// (missing when nil) twice, as key("x", b) and key("y", b); the decisions
// run on the Xs, each meant for the in-line path, then on the Ys, each with
// check added on key W, which sends it down the general path. Both sides
// run at the same now, so t fails where their replies (replyBytes an op)
// or the values they leave (read with both) differ, or where a check wrote
// W.
func bothPaths[H interface{ args() []uint64 }](t *testing.T, c *goredis.Client, script string, replyBytes, trial int, decisions [][]hitOn[H], check H, key func(side string, b int) string, values [][]byte, both func(*testing.T, *goredis.Client, string, string) (string, string)) {
	t.Helper()
	ctx := context.Background()
	for b, value := range values {
		for _, side := range []string{"x", "y"} {
			if value != nil {
				if err := c.Set(ctx, key(side, b), value, 0).Err(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	var keys []string
	var blob []byte
	d := uint64(0)
	for _, side := range []string{"x", "y"} {
		for _, dec := range decisions {
			d++
			for _, h := range dec {
				keys = append(keys, key(side, h.bucket))
				blob = appendArgs(blob, d, h.hit.args())
			}
			if side == "y" {
				keys = append(keys, key("w", 0))
				blob = appendArgs(blob, d, check.args())
			}
		}
	}
	v, err := c.Eval(ctx, script, keys, blob).Text()
	if err != nil {
		t.Fatalf("trial %d: %v", trial, err)
	}
	if len(v) != replyBytes*len(keys) {
		t.Fatalf("trial %d: reply of %d bytes, want %d", trial, len(v), replyBytes*len(keys))
	}
	x, y := 0, 0 // op index of the Xs' decision, and of the Ys'
	for _, dec := range decisions {
		y += len(dec)
	}
	for i, dec := range decisions {
		for j, h := range dec {
			inline := v[replyBytes*(x+j) : replyBytes*(x+j+1)]
			general := v[replyBytes*(y+j) : replyBytes*(y+j+1)]
			if inline != general {
				t.Errorf("trial %d, decision %d of %+v, op %+v: in line %v, general %v (values %x)", trial, i, decisions, h, floats(inline), floats(general), values)
			}
		}
		x, y = x+len(dec), y+len(dec)+1
	}
	if n, err := c.Exists(ctx, key("w", 0)).Result(); err != nil || n != 0 {
		t.Fatalf("trial %d: W exists (%d, %v): its checks wrote it", trial, n, err)
	}
	for b := range values {
		vx, vy := both(t, c, key("x", b), key("y", b))
		if vx != vy {
			t.Errorf("trial %d, decisions %+v, bucket %d from %x: left X %v, Y %v", trial, decisions, b, values[b], floats(vx), floats(vy))
		}
	}
}

// getBoth returns the values of keys a and b ("<nil>" when missing), read
// in one script call: Redis checks expiry against the script's start, so a
// key written with a PX of milliseconds cannot expire between the two
// reads. A pair where one key is missing and the other is a value whose
// recorded expiry has passed (by Redis' clock at the read) counts as equal:
// both were written with the same PX of a few milliseconds, but Redis
// before 7.2 counts PX from each SET, not from the script's start, so on a
// busy machine the key written first can expire a few milliseconds before
// the other.
func getBoth(t *testing.T, c *goredis.Client, a, b string) (string, string) {
	t.Helper()
	const get = "local t = redis.call('TIME'); return { redis.call('GET', KEYS[1]) or '<nil>', redis.call('GET', KEYS[2]) or '<nil>', t[1] * 1000 + math.floor(t[2] / 1000) }"
	v, err := c.Eval(context.Background(), get, []string{a, b}).Slice()
	if err != nil || len(v) != 3 {
		t.Fatalf("GET %s, %s: %v %v", a, b, v, err)
	}
	va, _ := v[0].(string)
	vb, _ := v[1].(string)
	nowms, _ := v[2].(int64)
	if va != vb && (va == "<nil>" && expiredBy(vb, nowms) || vb == "<nil>" && expiredBy(va, nowms)) {
		return va, va
	}
	return va, vb
}

// expiredBy reports whether v is a bucket value whose recorded expiry (its
// second double, MARGIN = 5 ms before the PX it was written with) is at or
// before nowms.
func expiredBy(v string, nowms int64) bool {
	if len(v) != 32 {
		return false
	}
	exp := math.Float64frombits(binary.LittleEndian.Uint64([]byte(v[8:16])))
	return exp+5 <= float64(nowms)
}

// floats reads s as little-endian doubles, for messages.
func floats(s string) []string {
	var out []string
	for i := 0; i+8 <= len(s); i += 8 {
		f := math.Float64frombits(binary.LittleEndian.Uint64([]byte(s[i : i+8])))
		out = append(out, strconv.FormatFloat(f, 'g', -1, 64))
	}
	return out
}

// TestScriptManyKeys checks a call of more keys than token_bucket.lua reads
// and replies to with one struct call (CHUNK, 64): 150 buckets, fresh, in
// decisions of one to three keys (some across a chunk's edge), each
// allowed, so that key k's reply is its own burst less its own cost.
func TestScriptManyKeys(t *testing.T) {
	t.Parallel()
	c := redistest.Start(t).Client()
	t.Cleanup(func() { _ = c.Close() })
	const n = 150
	var keys []string
	var blob []byte
	for k, d := 0, uint64(1); k < n; d++ {
		for range min(1+int(d%3), n-k) {
			keys = append(keys, fmt.Sprintf("many/%d", k))
			blob = appendArgs(blob, d, scriptHit{period: 3_600_000_000, requests: 1, burst: 1000 + uint64(k), cost: uint64(k % 7)}.args())
			k++
		}
	}
	v, err := c.Eval(context.Background(), tokenBucketLua, keys, blob).Text()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]keyReply, n)
	if err := parseReply(v, out); err != nil {
		t.Fatal(err)
	}
	for k, r := range out {
		if want := uint64(1000 + k - k%7); !r.allowed || r.remaining != want {
			t.Errorf("key %d: allowed %v, %d left, want allowed, %d left", k, r.allowed, r.remaining, want)
		}
	}
}

// TestScriptSameAsOld checks that token_bucket.lua decides as another
// version of it does (same arguments and reply), when SLUICE_SCRIPT_OLD
// names that version, e.g. main's:
//
//	git show main:backend/redis/token_bucket.lua > /tmp/old.lua
//	SLUICE_SCRIPT_OLD=/tmp/old.lua go test -run TestScriptSameAsOld ./backend/redis/
//
// Both run in one EVAL, as two functions reading one TIME, on copies of the
// same buckets (missing, foreign, or recorded around now under the hits'
// limits or others): random decisions of one to four hits of any kind,
// buckets repeated within a decision too. Replies and the values left must
// be byte-equal. Without SLUICE_SCRIPT_OLD it is skipped: a change of
// behaviour is meant to differ from the version before it.
func TestScriptSameAsOld(t *testing.T) {
	path := os.Getenv("SLUICE_SCRIPT_OLD")
	if path == "" {
		t.Skip("set SLUICE_SCRIPT_OLD=<another token_bucket.lua> to compare with it")
	}
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const timeCall = "redis.call('TIME')"
	if strings.Count(string(old), timeCall) != 1 || strings.Count(tokenBucketLua, timeCall) != 1 {
		t.Fatalf("each script must call %s once", timeCall)
	}
	both := "local T = " + timeCall + "\n" +
		"local function old(KEYS, ARGV)\n" + strings.Replace(string(old), timeCall, "T", 1) + "\nend\n" +
		"local function new(KEYS, ARGV)\n" + strings.Replace(tokenBucketLua, timeCall, "T", 1) + "\nend\n" +
		"local n = #KEYS / 2\n" +
		"local ko, kn = {}, {}\n" +
		"for i = 1, n do ko[i], kn[i] = KEYS[i], KEYS[n + i] end\n" +
		"return { old(ko, ARGV), new(kn, ARGV) }\n"
	c := redistest.Start(t).Client()
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(2, 13))
	pick := func(v ...uint64) uint64 { return v[rng.IntN(len(v))] }
	limits := func() scriptHit {
		return scriptHit{
			period:   pick(1, 7, 1_000_000, 3_600_000_000),
			requests: pick(0, 1, 3, 10, 1000, 1<<40),
			burst:    pick(0, 1, 5, 1000, 1<<40),
		}
	}
	const buckets = 4
	compared := 0
	for trial := range 1000 {
		tm, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		now := float64(tm.UnixMicro())
		usual := make([]scriptHit, buckets) // each bucket's usual limit
		for b := range usual {
			usual[b] = limits()
		}
		key := func(side string, b int) string { return fmt.Sprintf("old/%d/%s%d", trial, side, b) }
		for b := range buckets {
			var value []byte
			switch rng.IntN(4) {
			case 0: // missing
			case 1:
				value = []byte("16 bytes, old  ")
			default:
				h := usual[b]
				if rng.IntN(3) == 0 {
					h = limits()
				}
				iv, bu := float64(max(h.period, 1))/float64(max(h.requests, 1)), float64(h.burst)
				tat := now + (rng.Float64()*2-0.5)*iv*max(bu, 1)
				for _, f := range []float64{tat, math.Floor(tat/1000) + float64(pick(0, 1, 5000)), iv, bu} {
					value = binary.LittleEndian.AppendUint64(value, math.Float64bits(f))
				}
			}
			for _, side := range []string{"o", "n"} {
				if value != nil {
					if err := c.Set(ctx, key(side, b), value, 0).Err(); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		var keys, newKeys []string
		var blob []byte
		for d := range 1 + rng.IntN(10) {
			for range 1 + rng.IntN(4) {
				b := rng.IntN(buckets)
				h := usual[b]
				if rng.IntN(4) == 0 {
					h = limits()
				}
				h.cost, h.flags = pick(0, 1, 1, 2, 7, 1<<41), pick(0, 0, 0, 1, 2, 3, 6)
				keys, newKeys = append(keys, key("o", b)), append(newKeys, key("n", b))
				blob = appendArgs(blob, uint64(d+1), h.args())
			}
		}
		v, err := c.Eval(ctx, both, append(keys, newKeys...), blob).Slice()
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		if len(v) != 2 || v[0] != v[1] {
			t.Errorf("trial %d, %d keys: old %v, new %v", trial, len(keys), v[0], v[1])
		}
		for b := range buckets {
			vo, vn := getBoth(t, c, key("o", b), key("n", b))
			if vo != vn {
				t.Errorf("trial %d, bucket %d: left old %v, new %v", trial, b, floats(vo), floats(vn))
			}
		}
		compared += len(keys)
	}
	t.Logf("%d keys' replies compared", compared)
}
