package redis

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/bucket"
)

func TestSlot(t *testing.T) {
	t.Parallel()
	// Values from the Redis Cluster specification and CLUSTER KEYSLOT.
	for tag, want := range map[string]int{"123456789": 0x31c3, "foo": 12182, "bar": 5061, "somekey": 11058, "": 0} {
		if got := slot([]byte(tag)); got != want {
			t.Errorf("slot(%q) = %d, want %d", tag, got, want)
		}
	}
}

// packReply builds a token_bucket.lua reply of the given values.
func packReply(vals ...float64) string {
	var b []byte
	for _, v := range vals {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	}
	return string(b)
}

func TestParseReply(t *testing.T) {
	t.Parallel()
	good := packReply(1, 4, 0, 1000, 0)
	out := make([]keyReply, 1)
	if err := parseReply(good, out); err != nil {
		t.Fatalf("parseReply(1 4 0 1000 0): %v", err)
	}
	want := keyReply{allowed: true, remaining: 4, reset: time.Millisecond}
	if out[0] != want {
		t.Errorf("parseReply(1 4 0 1000 0) = %+v, want %+v", out[0], want)
	}
	two := make([]keyReply, 2)
	if err := parseReply(packReply(0, 0, 7, 1<<53-1, 3, 1, 1, 0, 0, 0), two); err != nil {
		t.Fatalf("parseReply of two keys: %v", err)
	}
	if want := (keyReply{retry: 7 * time.Microsecond, reset: (1<<53 - 1) * time.Microsecond, next: 3 * time.Microsecond}); two[0] != want {
		t.Errorf("parseReply of two keys: first %+v, want %+v", two[0], want)
	}
	if want := (keyReply{allowed: true, remaining: 1}); two[1] != want {
		t.Errorf("parseReply of two keys: second %+v, want %+v", two[1], want)
	}
	for _, bad := range []any{
		nil, int64(1), []any{int64(1), int64(4), int64(0), int64(1000), int64(0)},
		"", "1 4 0 1000 0", packReply(1, 4, 0, 1000), packReply(1, 4, 0, 1000, 0, 1),
		good + "x", good[:len(good)-1],
		packReply(2, 4, 0, 1000, 0), packReply(1, -4, 0, 1000, 0), packReply(1, 4.5, 0, 1000, 0),
		packReply(1, math.NaN(), 0, 1000, 0), packReply(1, 4, math.Inf(1), 1000, 0),
		packReply(1, 4, 0, 1<<53, 0), packReply(1, 4, 0, 1e30, 0),
	} {
		err := parseReply(bad, make([]keyReply, 1))
		if !errors.Is(err, ErrScript) || !strings.Contains(err.Error(), "token_bucket.lua") {
			t.Errorf("parseReply(%q) = %v, want ErrScript naming token_bucket.lua", bad, err)
		}
	}
}

func TestReadReplies(t *testing.T) {
	t.Parallel()
	a, b := &part{replies: make([]keyReply, 1)}, &part{replies: make([]keyReply, 2)}
	if err := readReplies(packReply(1, 4, 0, 1, 0, 0, 0, 5, 6, 7, 1, 2, 0, 3, 0), []*part{a, b}); err != nil {
		t.Fatalf("readReplies of 1 + 2 keys: %v", err)
	}
	if a.replies[0].remaining != 4 || b.replies[0].retry != 5*time.Microsecond || b.replies[1].remaining != 2 {
		t.Errorf("readReplies: %+v %+v, want parts filled in order", a.replies, b.replies)
	}
	if err := readReplies(packReply(1, 4, 0, 1, 0, 0, 0, 5, 6, 7), []*part{a, b}); !errors.Is(err, ErrScript) {
		t.Errorf("readReplies of a short reply: %v, want ErrScript", err)
	}
}

// cacheLen returns the number of entries of c, expired ones included.
func cacheLen(c *emptyCache) int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		n += len(s.m)
		s.mu.Unlock()
	}
	return n
}

func TestEmptyCacheBound(t *testing.T) {
	t.Parallel()
	c := newEmptyCache(cacheShards * 2)
	now := time.Unix(1000, 0)
	e := emptyEntry{next: now.Add(time.Second), full: now.Add(2 * time.Second)}
	for i := range 10000 {
		var k bucket.Key
		copy(k[:], fmt.Sprint(i))
		k[8], k[9] = byte(i), byte(i>>8)
		c.put(k, e, now)
	}
	if n := cacheLen(c); n > cacheShards*2 {
		t.Errorf("cache of 128 holds %d entries after 10000 puts", n)
	}
	var k bucket.Key
	c.put(k, e, now)
	if _, ok := c.get(k, bucket.Limit{}, now); !ok {
		t.Errorf("get right after put: miss, want hit")
	}
	if _, ok := c.get(k, bucket.Limit{}, e.next); ok {
		t.Errorf("get at the entry's next token: hit, want miss")
	}
	c.put(k, e, now)
	c.drop(k)
	if _, ok := c.get(k, bucket.Limit{}, now); ok {
		t.Errorf("get after drop: hit, want miss")
	}
	if newEmptyCache(-1) != nil {
		t.Errorf("newEmptyCache(-1) is not nil (off)")
	}
	var off *emptyCache
	off.put(k, e, now)
	if _, ok := off.get(k, bucket.Limit{}, now); ok {
		t.Errorf("a nil cache hit")
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

var _ net.Error = timeoutErr{}

// redisErr is an error reply as go-redis returns it.
type redisErr string

func (e redisErr) Error() string { return string(e) }

// RedisError marks redisErr as a Redis reply (goredis.Error).
func (redisErr) RedisError() {}

func TestClassify(t *testing.T) {
	t.Parallel()
	live := context.Background()
	expired, cancel := context.WithDeadline(live, time.Unix(1, 0))
	defer cancel()
	canceled, cancel2 := context.WithCancel(live)
	cancel2()
	tests := []struct {
		ctx  context.Context
		err  error
		want string
	}{
		{live, context.DeadlineExceeded, KindTimeout},
		{live, fmt.Errorf("read: %w", timeoutErr{}), KindTimeout},
		{live, goredis.ErrPoolTimeout, KindTimeout},
		{expired, io.EOF, KindTimeout},
		{canceled, io.EOF, KindOther},
		{live, context.Canceled, KindOther},
		{live, goredis.ErrNoScript, KindScript},
		{live, errors.New("x"), KindOther},
		{live, &net.OpError{Op: "dial", Err: syscall.ECONNREFUSED}, KindConnection},
		{live, io.EOF, KindConnection},
		{live, goredis.ErrClosed, KindConnection},
		// Redis 7.0's own words (redis-cli against redis-server 7.0.15).
		{live, redisErr("OOM command not allowed when used memory > 'maxmemory'. script: 0c17890de7f95106c3180477950cc3bf34d234f4, on @user_script:1."), KindOOM},
		{live, redisErr("OOM command not allowed when used memory > 'maxmemory'."), KindOOM},
		{live, redisErr("NOPERM this user has no permissions to run the 'evalsha' command"), KindNoPerm},
		{live, redisErr("ERR The user executing the script can't run this command or subcommand script: 82cdd3d7ab6b96f9a5947917c9f163ca06cc907a, on @user_script:1."), KindNoPerm},
		{live, redisErr("ERR user_script:1: Script attempted to access nonexistent global variable 'x' script: 1a2b"), KindScript},
	}
	for _, tt := range tests {
		err := classify(tt.ctx, "op", tt.err)
		if got := ErrorKind(err); got != tt.want {
			t.Errorf("ErrorKind(classify(%v)) = %q, want %q (error %v)", tt.err, got, tt.want, err)
		}
		if !errors.Is(err, tt.err) {
			t.Errorf("classify(%v) = %v, which does not wrap the original", tt.err, err)
		}
	}
	if ErrorKind(nil) != "" {
		t.Errorf("ErrorKind(nil) = %q, want \"\"", ErrorKind(nil))
	}
}

func TestRedact(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"redis://u:pw@h:1/0":           "redis://u:xxxxx@h:1/0",
		"redis://:pw@h:1,redis://h2:2": "redis://:xxxxx@h:1,redis://h2:2",
		"sentinel://u:pw@m@s:1,s:2":    "sentinel://u:xxxxx@m@s:1,s:2",
		"sentinel://m@s:1":             "sentinel://m@s:1",
		"h:1,h:2":                      "h:1,h:2",
	} {
		if got := redact(in); got != want {
			t.Errorf("redact(%q) = %q, want %q", in, got, want)
		}
	}
}
