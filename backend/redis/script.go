package redis

import (
	_ "embed" // token_bucket.lua
	"encoding/binary"
	"fmt"
	"math"
	"time"
)

// tokenBucketLua is the one script of the global layer; its header documents
// KEYS, ARGV, the reply and the TTL rule.
//
//go:embed token_bucket.lua
var tokenBucketLua string

// The strides of token_bucket.lua's binary protocol: argsPerKey values per
// key in a part (period, requests, burst, cost, flags), sent as argBytes
// bytes with the decision number in front; replyBytes per key come back.
const (
	argsPerKey = 5
	argBytes   = 8 * (argsPerKey + 1)
	replyBytes = 8 * 5
)

// Script flags, as token_bucket.lua reads them.
const (
	flagGive        = 1
	flagIndependent = 2
	flagOverdraw    = 4 // with flagIndependent only
)

// maxReplyValue bounds every reply value: the script clamps to 2^53 - 1,
// the largest integer a double holds exactly.
const maxReplyValue = 1<<53 - 1

// keyReply is token_bucket.lua's answer for one key.
type keyReply struct {
	allowed   bool
	remaining uint64
	retry     time.Duration // until cost tokens exist, when refused
	reset     time.Duration // until the bucket is full
	next      time.Duration // until one whole token exists, when none is left
}

// appendArgs appends the script's argument bytes for one key: the decision
// number, then the key's argsPerKey values, as little-endian doubles.
func appendArgs(b []byte, decision uint64, args []uint64) []byte {
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(float64(decision)))
	for _, v := range args {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(float64(v)))
	}
	return b
}

// parseReply reads a whole token_bucket.lua reply into out, one entry per
// key, checking every type and bound: an odd reply is an error, never a
// panic.
func parseReply(v any, out []keyReply) error {
	rd, err := newReplyReader(v)
	if err != nil {
		return err
	}
	if err := rd.read(out); err != nil {
		return err
	}
	return rd.end()
}

// replyReader reads the reply of a script call that carried several
// decisions, decision by decision, without allocating.
type replyReader struct {
	s   string
	pos int // byte offset of the next key's reply
}

func newReplyReader(v any) (replyReader, error) {
	s, ok := v.(string)
	if !ok {
		return replyReader{}, fmt.Errorf("%w: reply is %T, want a string", ErrScript, v)
	}
	if len(s)%replyBytes != 0 {
		return replyReader{}, fmt.Errorf("%w: reply has %d bytes, want a multiple of %d", ErrScript, len(s), replyBytes)
	}
	return replyReader{s: s}, nil
}

// read fills out with the next len(out) keys' replies.
func (rd *replyReader) read(out []keyReply) error {
	if need := len(out) * replyBytes; len(rd.s)-rd.pos < need {
		return fmt.Errorf("%w: reply has %d keys, want more", ErrScript, len(rd.s)/replyBytes)
	}
	for i := range out {
		var f [replyBytes / 8]uint64
		for j := range f {
			x := math.Float64frombits(le64(rd.s[rd.pos:]))
			if !(x >= 0 && x <= maxReplyValue) || x != math.Trunc(x) {
				return fmt.Errorf("%w: reply value %d of key %d is %v, want an integer in [0, 2^53)", ErrScript, j+1, rd.pos/replyBytes+1, x)
			}
			f[j] = uint64(x)
			rd.pos += 8
		}
		if f[0] > 1 {
			return fmt.Errorf("%w: key %d: allowed is %d, want 0 or 1", ErrScript, rd.pos/replyBytes, f[0])
		}
		out[i] = keyReply{
			allowed:   f[0] == 1,
			remaining: f[1],
			retry:     time.Duration(f[2]) * time.Microsecond,
			reset:     time.Duration(f[3]) * time.Microsecond,
			next:      time.Duration(f[4]) * time.Microsecond,
		}
	}
	return nil
}

// le64 is binary.LittleEndian.Uint64 for a string, which go-redis gives
// the reply as (converting it to []byte would copy it).
func le64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// end checks that the whole reply was read.
func (rd *replyReader) end() error {
	if rd.pos != len(rd.s) {
		return fmt.Errorf("%w: reply has %d keys, want %d", ErrScript, len(rd.s)/replyBytes, rd.pos/replyBytes)
	}
	return nil
}
