package redis

import (
	_ "embed" // token_bucket.lua
	"fmt"
	"strings"
	"time"
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

// Script flags, as token_bucket.lua reads them.
const (
	flagGive        = 1
	flagIndependent = 2
)

// maxReplyValue bounds every reply value: the script clamps to 2^53 - 1,
// the largest integer a Lua number holds exactly.
const maxReplyValue = 1<<53 - 1

// keyReply is token_bucket.lua's answer for one key.
type keyReply struct {
	allowed   bool
	remaining uint64
	retry     time.Duration // until cost tokens exist, when refused
	reset     time.Duration // until the bucket is full
	next      time.Duration // until one whole token exists, when none is left
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
	pos int // byte offset of the next value
	n   int // values read
}

func newReplyReader(v any) (replyReader, error) {
	s, ok := v.(string)
	if !ok {
		return replyReader{}, fmt.Errorf("%w: reply is %T, want a string", ErrScript, v)
	}
	return replyReader{s: s}, nil
}

// read fills out with the next len(out) keys' replies.
func (rd *replyReader) read(out []keyReply) error {
	for i := range out {
		var f [replyPerKey]int64
		for j := range f {
			n, err := rd.value()
			if err != nil {
				return err
			}
			f[j] = n
		}
		if f[0] > 1 {
			return fmt.Errorf("%w: reply value %d (allowed) is %d, want 0 or 1", ErrScript, rd.n-replyPerKey+1, f[0])
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

// value parses the next value: decimal digits, then a space or the end.
func (rd *replyReader) value() (int64, error) {
	rd.n++
	if rd.pos >= len(rd.s) {
		return 0, fmt.Errorf("%w: reply has %d values, want more", ErrScript, rd.n-1)
	}
	var n int64
	start := rd.pos
	for rd.pos < len(rd.s) && rd.s[rd.pos] != ' ' {
		c := rd.s[rd.pos]
		if c < '0' || c > '9' || n > maxReplyValue/10 {
			return 0, rd.bad(start)
		}
		n = n*10 + int64(c-'0')
		rd.pos++
	}
	if rd.pos == start || n > maxReplyValue {
		return 0, rd.bad(start)
	}
	if rd.pos < len(rd.s) {
		rd.pos++ // the space
		if rd.pos == len(rd.s) {
			return 0, fmt.Errorf("%w: reply ends with a space", ErrScript)
		}
	}
	return n, nil
}

func (rd *replyReader) bad(start int) error {
	end := strings.IndexByte(rd.s[start:], ' ')
	if end < 0 {
		end = len(rd.s) - start
	}
	return fmt.Errorf("%w: reply value %d is %q, want an integer in [0, 2^53)", ErrScript, rd.n, rd.s[start:start+end])
}

// end checks that the whole reply was read.
func (rd *replyReader) end() error {
	if rd.pos != len(rd.s) {
		extra := strings.Count(rd.s[rd.pos:], " ") + 1
		return fmt.Errorf("%w: reply has %d values, want %d", ErrScript, rd.n+extra, rd.n)
	}
	return nil
}
