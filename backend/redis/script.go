package redis

import (
	_ "embed" // token_bucket.lua
	"fmt"
	"time"

	"github.com/sluice-rls/sluice/descriptors"
)

// tokenBucketLua is the one script of the global layer; its header documents
// KEYS, ARGV, the reply and the TTL rule.
//
//go:embed token_bucket.lua
var tokenBucketLua string

// argsPerKey and replyPerKey are the ARGV and reply strides of
// token_bucket.lua.
const (
	argsPerKey  = 6
	replyPerKey = 5
)

// batch is the arguments and reply of one script call: the hits of one or
// more decisions (numbered in ARGV, contiguous), all in one cluster slot.
// Hit sends one decision per call today; a batcher sharing round trips
// between concurrent requests adds several.
type batch struct {
	slot   int             // cluster slot of every key (routeSlot)
	bucket descriptors.Key // the only bucket (routeKey)

	keys    []string
	args    []any
	refs    []int // index of each key's hit in its decision
	replies []keyReply

	err      error
	refunded bool // a refund gave its takes back
}

// add appends hit h, the ref-th of decision number dec, under key.
func (b *batch) add(dec int, key string, h *descriptors.Hit, ref, flags int) {
	period := max(int64(h.Limit.Period/time.Microsecond), 1)
	b.keys = append(b.keys, key)
	b.args = append(b.args, dec, period, h.Limit.Requests, h.Limit.Burst, h.Cost, flags)
	b.refs = append(b.refs, ref)
}

// fill writes the states of the batch's hits and reports whether all its
// takes were allowed.
func (b *batch) fill(d *decision) bool {
	ok := true
	for j, i := range b.refs {
		r := &b.replies[j]
		d.states[i] = descriptors.BucketState{
			Allowed:    r.allowed,
			Remaining:  r.remaining,
			RetryAfter: r.retry,
			ResetAfter: r.reset,
		}
		if !r.allowed && isTake(&d.hits[i]) {
			ok = false
		}
	}
	return ok
}

// keyReply is token_bucket.lua's answer for one key.
type keyReply struct {
	allowed   bool
	remaining uint64
	retry     time.Duration // until cost tokens exist, when refused
	reset     time.Duration // until the bucket is full
	next      time.Duration // until one whole token exists, when none is left
}

// parseReply reads token_bucket.lua's reply into out, one entry per key,
// checking every type and bound: an odd reply is an error, never a panic.
func parseReply(v any, out []keyReply) error {
	arr, ok := v.([]any)
	if !ok {
		return fmt.Errorf("%w: reply is %T, want an array", ErrScript, v)
	}
	if len(arr) != replyPerKey*len(out) {
		return fmt.Errorf("%w: reply has %d values for %d keys, want %d",
			ErrScript, len(arr), len(out), replyPerKey*len(out))
	}
	for i := range out {
		var f [replyPerKey]int64
		for j := range f {
			pos := replyPerKey*i + j
			n, ok := arr[pos].(int64)
			if !ok || n < 0 {
				return fmt.Errorf("%w: reply value %d is %v (%T), want an integer >= 0",
					ErrScript, pos+1, arr[pos], arr[pos])
			}
			f[j] = n
		}
		if f[0] > 1 {
			return fmt.Errorf("%w: reply value %d (allowed) is %d, want 0 or 1",
				ErrScript, replyPerKey*i+1, f[0])
		}
		out[i] = keyReply{
			allowed:   f[0] == 1,
			remaining: uint64(f[1]),
			retry:     time.Duration(f[2]) * time.Microsecond,
			reset:     time.Duration(f[3]) * time.Microsecond,
			next:      time.Duration(f[4]) * time.Microsecond,
		}
	}
	return nil
}
