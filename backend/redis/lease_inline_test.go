package redis

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/internal/redistest"
)

// leaseHit is one op of a lease.lua call after its decision number, as
// the script reads them.
type leaseHit struct {
	period, requests, burst, need, take, extra, share, flags, window, since, unpark uint64
}

func (h leaseHit) args() []uint64 {
	return []uint64{h.period, h.requests, h.burst, h.need, h.take, h.extra, h.share, h.flags, h.window, h.since, h.unpark}
}

// TestLeaseInline checks that lease.lua's in-line path (a decision of one
// op, or of takes on distinct buckets) decides exactly as its general
// path, as TestScriptInline does token_bucket.lua's. Each trial gives
// buckets X1..X3 and Y1..Y3 the same values (missing, a foreign value, or
// a TAT, expiry and limit around Redis' now, under the bucket's usual
// limit or another, with or without a parked count whose windows may have
// ended), then one call runs the same decisions on the Xs and on the Ys,
// each Y decision with an independent check of a full bucket W added
// (never refused, never written), which sends it down the general path.
// Decisions are one op of any kind (takes leasing or not, gives, returns
// that unpark or not, independent takes, overdraws, under the bucket's
// usual limit or another), often the one before again (a hot key's
// batch), takes on two or three buckets, or, general on both sides,
// takes on one bucket twice and ops of mixed kinds. Both halves see the
// same now, so their replies and the values left in Xi and Yi must be
// byte-equal.
func TestLeaseInline(t *testing.T) {
	t.Parallel()
	c := redistest.Start(t).Client()
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 13))
	pick := func(v ...uint64) uint64 { return v[rng.IntN(len(v))] }
	limits := func() leaseHit {
		return leaseHit{
			period:   pick(1, 7, 1_000_000, 3_600_000_000),
			requests: pick(0, 1, 3, 10, 1000, 1<<40),
			burst:    pick(0, 1, 5, 1000, 1<<40),
		}
	}
	check := leaseHit{period: 1_000_000, requests: 1, burst: 1, share: 1, flags: 2}
	const buckets = 3
	inline, general := 0, 0 // X decisions meant for each path
	for trial := range 600 {
		tm, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		now := float64(tm.UnixMicro())
		usual := make([]leaseHit, buckets)
		for b := range usual {
			usual[b] = limits()
		}
		hit := func(b int, flags uint64) hitOn[leaseHit] {
			h := usual[b]
			if rng.IntN(4) == 0 {
				h = limits()
			}
			h.need = pick(0, 1, 2, 7, 1<<41)
			h.take = min(h.need, pick(0, 1, 2, 7, 1<<41))
			if flags == 1 || flags == 3 {
				h.take = pick(0, 1, 7, 1<<41)
			}
			h.extra, h.share, h.flags = pick(0, 0, 1, 10, 1<<41), pick(1, 2, 4), flags
			h.window = pick(0, 1000, 2_000_000, 3_600_000_000)
			if flags == 3 {
				h.since = pick(0, 1, uint64(now)-1_000_000, uint64(now), 1<<52)
				h.unpark = pick(0, 1, 11, 1<<41)
			}
			return hitOn[leaseHit]{b, h}
		}
		var decisions [][]hitOn[leaseHit]
		for range 1 + rng.IntN(8) {
			switch last := len(decisions) - 1; {
			case last >= 0 && len(decisions[last]) == 1 && rng.IntN(2) == 0:
				decisions = append(decisions, decisions[last]) // a hot key's batch
			case rng.IntN(2) == 0:
				decisions = append(decisions, []hitOn[leaseHit]{hit(rng.IntN(buckets), pick(0, 0, 0, 1, 2, 2, 3, 3, 6))})
				inline++
			case rng.IntN(3) > 0:
				var d []hitOn[leaseHit]
				for _, b := range rng.Perm(buckets)[:2+rng.IntN(buckets-1)] {
					d = append(d, hit(b, 0))
				}
				decisions = append(decisions, d)
				inline++
			default: // general on both sides
				b := rng.IntN(buckets)
				decisions = append(decisions, []hitOn[leaseHit]{hit(b, 0), hit([]int{b, rng.IntN(buckets)}[rng.IntN(2)], pick(0, 1, 2, 3))})
				general++
			}
		}
		key := func(side string, b int) string { return fmt.Sprintf("lease-inline/%d/%s%d", trial, side, b) }
		values := make([][]byte, buckets)
		for b := range buckets {
			var value []byte
			switch rng.IntN(5) {
			case 0: // missing
			case 1:
				value = []byte("8 bytes!")
			default:
				h := usual[b]
				if rng.IntN(3) == 0 {
					h = limits()
				}
				iv := float64(max(h.period, 1)) / float64(max(h.requests, 1))
				bu := float64(h.burst)
				tat := now + (rng.Float64()*2-0.5)*iv*max(bu, 1)
				fs := []float64{tat, math.Floor(tat/1000) + float64(pick(0, 1, 5000)), iv, bu}
				if rng.IntN(2) == 0 { // a parked count, its windows ended or not
					w := float64(pick(0, 1000, 2_000_000))
					start := now - rng.Float64()*3*w
					pstart := start - float64(pick(0, 1))*w
					fs = append(fs, w, start, pstart, float64(pick(0, 1, 5, 100)), float64(pick(0, 3, 50)))
				}
				for _, f := range fs {
					value = binary.LittleEndian.AppendUint64(value, math.Float64bits(f))
				}
			}
			values[b] = value
		}
		bothPaths(t, c, leaseLua, leaseReplyBytes, trial, decisions, check, key, values, leaseBoth)
	}
	t.Logf("X decisions: %d meant in line, %d general", inline, general)
}

// leaseBoth returns the lease.lua values of keys a and b ("<nil>" when
// missing), as getBoth does token_bucket.lua's: a missing key and a value
// whose recorded expiry (lease.lua records the PX it sets, from its TIME)
// is at or before Redis' clock count as equal.
func leaseBoth(t *testing.T, c *goredis.Client, a, b string) (string, string) {
	t.Helper()
	const get = "local t = redis.call('TIME'); return { redis.call('GET', KEYS[1]) or '<nil>', redis.call('GET', KEYS[2]) or '<nil>', t[1] * 1000 + math.floor(t[2] / 1000) }"
	v, err := c.Eval(context.Background(), get, []string{a, b}).Slice()
	if err != nil || len(v) != 3 {
		t.Fatalf("GET %s, %s: %v %v", a, b, v, err)
	}
	va, _ := v[0].(string)
	vb, _ := v[1].(string)
	nowms, _ := v[2].(int64)
	expired := func(v string) bool {
		return (len(v) == 32 || len(v) == 72) && math.Float64frombits(binary.LittleEndian.Uint64([]byte(v[8:16]))) <= float64(nowms)
	}
	if va != vb && (va == "<nil>" && expired(vb) || vb == "<nil>" && expired(va)) {
		return va, va
	}
	return va, vb
}
