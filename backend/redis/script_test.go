package redis

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/sluice-rls/sluice/internal/redistest"
)

// scriptHit is one key of a token_bucket.lua call: period, requests,
// burst, cost and flags, as the script reads them.
type scriptHit struct{ period, requests, burst, cost, flags uint64 }

func (h scriptHit) args() []uint64 {
	return []uint64{h.period, h.requests, h.burst, h.cost, h.flags}
}

// TestScriptOneKeyInline checks that token_bucket.lua decides a decision of
// one key, which it runs in line (its fast path), exactly as it decides the
// same key through decide, as part of a decision of two keys. Each trial
// gives buckets X and Y the same value (missing, a foreign value, or a
// recorded TAT, expiry and limit around Redis' now, under the hits' limit
// or another), then one call decides every hit on X alone (consecutive
// decisions on one bucket, as a hot key's batch) and every hit on Y beside
// a check of a full bucket W, which never refuses. Both see the same now,
// so their replies and the values left in X and Y must be byte-equal.
func TestScriptOneKeyInline(t *testing.T) {
	t.Parallel()
	c := redistest.Start(t).Client()
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 13))
	pick := func(v ...uint64) uint64 { return v[rng.IntN(len(v))] }
	randHit := func() scriptHit {
		return scriptHit{
			period:   pick(1, 7, 1_000_000, 3_600_000_000),
			requests: pick(0, 1, 3, 10, 1000, 1<<40),
			burst:    pick(0, 1, 5, 1000, 1<<40),
			cost:     pick(0, 1, 2, 7, 1<<41),
			flags:    pick(0, 0, 1, 2, 3),
		}
	}
	check := scriptHit{period: 1_000_000, requests: 1, burst: 1, cost: 0}
	for trial := range 400 {
		tm, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		now := float64(tm.UnixMicro())
		hits := []scriptHit{randHit()}
		for range rng.IntN(6) {
			if rng.IntN(2) == 0 {
				hits = append(hits, hits[len(hits)-1]) // a hot key's batch
			} else {
				hits = append(hits, randHit())
			}
		}
		x, y, w := fmt.Sprintf("inline/%d/x", trial), fmt.Sprintf("inline/%d/y", trial), fmt.Sprintf("inline/%d/w", trial)
		var value []byte
		switch rng.IntN(4) {
		case 0: // missing
		case 1:
			value = []byte("16 bytes, old  ")
		default:
			h := hits[0]
			interval := float64(max(h.period, 1)) / float64(max(h.requests, 1))
			iv, bu := interval, float64(h.burst)
			if rng.IntN(2) == 0 {
				iv, bu = interval*float64(pick(2, 3))/2, float64(pick(1, 4, 1000))
			}
			tat := now + (rng.Float64()*2-0.5)*iv*bu
			for _, f := range []float64{tat, math.Floor(tat/1000) + float64(pick(0, 1, 5000)), iv, bu} {
				value = binary.LittleEndian.AppendUint64(value, math.Float64bits(f))
			}
		}
		for _, k := range []string{x, y} {
			if value != nil {
				if err := c.Set(ctx, k, value, 0).Err(); err != nil {
					t.Fatal(err)
				}
			}
		}
		var keys []string
		var blob []byte
		d := uint64(0)
		for _, h := range hits {
			d++
			keys = append(keys, x)
			blob = appendArgs(blob, d, h.args())
		}
		for _, h := range hits {
			d++
			keys = append(keys, w, y)
			blob = appendArgs(blob, d, check.args())
			blob = appendArgs(blob, d, h.args())
		}
		v, err := c.Eval(ctx, tokenBucketLua, keys, blob).Text()
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		if len(v) != replyBytes*len(keys) {
			t.Fatalf("trial %d: reply of %d bytes, want %d", trial, len(v), replyBytes*len(keys))
		}
		n := len(hits)
		for i, h := range hits {
			alone := v[replyBytes*i : replyBytes*(i+1)]
			beside := v[replyBytes*(n+2*i+1) : replyBytes*(n+2*i+2)]
			if alone != beside {
				t.Errorf("trial %d, hit %d %+v of %+v on %x: alone %v, beside a check %v", trial, i, h, hits, value, floats(alone), floats(beside))
			}
		}
		vx, errX := c.Get(ctx, x).Bytes()
		vy, errY := c.Get(ctx, y).Bytes()
		if !bytes.Equal(vx, vy) || (errX == nil) != (errY == nil) {
			t.Errorf("trial %d, hits %+v on %x: left X %v (%v), Y %v (%v)", trial, hits, value, floats(string(vx)), errX, floats(string(vy)), errY)
		}
	}
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
