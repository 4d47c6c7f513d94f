package redis

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"

	goredis "github.com/redis/go-redis/v9"
)

// sender is the scratch of a writer (or an inline caller) for building and
// sending script calls. Senders are pooled, so a call's arguments cost no
// allocation: keys and numbers go to go-redis as pointers into the parts,
// which an interface holds without boxing.
type sender struct {
	batch []*part  // the parts to send, taken from a queue
	calls []call   // one per script call
	args  []any    // every call's command arguments, back to back
	blob  []byte   // every call's ARGV[1], back to back
	nkeys []uint64 // every call's key count (numkeys)
}

// call is one script call: the parts of one slot, bucket or master
// (anySlot) in a batch, each its own decision.
type call struct {
	parts []*part
	cmd   *goredis.Cmd
	retry bool // answered NOSCRIPT: sent again with EVAL
}

// send sends the parts of batch in as few script calls as the routing
// allows, all at once (one pipeline when there are several), under ctx, and
// answers every part. Parts whose caller gave up are answered unsent.
func (l *Limiter) send(ctx context.Context, s *sender, batch []*part) {
	live := batch[:0]
	for _, p := range batch {
		if p.req.abandoned.Load() {
			l.answer(p, errAbandoned)
			continue
		}
		live = append(live, p)
	}
	if len(live) == 0 {
		return
	}
	if l.route != routeOne && len(live) > 1 {
		slices.SortFunc(live, func(a, b *part) int {
			return cmp.Or(cmp.Compare(a.slot, b.slot), bytes.Compare(a.bucket[:], b.bucket[:]))
		})
	}
	s.calls, s.args, s.blob = s.calls[:0], s.args[:0], s.blob[:0]
	start := 0
	for i := 1; i <= len(live); i++ {
		if i == len(live) || live[i].slot != live[start].slot || live[i].bucket != live[start].bucket {
			s.calls = append(s.calls, call{parts: live[start:i]})
			start = i
		}
	}
	if cap(s.nkeys) < len(s.calls) {
		s.nkeys = make([]uint64, len(s.calls))
	}
	s.nkeys = s.nkeys[:len(s.calls)]
	for i := range s.calls {
		s.calls[i].cmd = s.build(ctx, l, i, false)
	}
	l.exec(ctx, s.calls, false)

	// After a Redis restart or failover flushed the script cache: EVAL loads
	// the script and runs it; later calls find it again.
	retry := false
	for i := range s.calls {
		c := &s.calls[i]
		err := c.cmd.Err()
		c.retry = err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT")
		if c.retry {
			c.cmd = s.build(ctx, l, i, true)
			retry = true
		}
	}
	if retry {
		l.exec(ctx, s.calls, true)
	}

	for i := range s.calls {
		l.answerCall(ctx, &s.calls[i])
		s.calls[i] = call{}
	}
	clear(s.args)
}

// build returns the command of call i: EVALSHA, or EVAL when eval is set,
// with the keys and arguments of its parts, numbered as decisions 1, 2, ...
func (s *sender) build(ctx context.Context, l *Limiter, i int, eval bool) *goredis.Cmd {
	c := &s.calls[i]
	merged := c.parts[0].slot == anySlot
	keys := 0
	for _, p := range c.parts {
		keys += len(p.keys)
	}
	s.nkeys[i] = uint64(keys)
	if merged {
		s.nkeys[i] = 1 // KEYS[1] routes; the bucket keys follow ARGV[1]
	}
	start := len(s.args)
	if eval {
		s.args = append(s.args, "eval", l.srcArg, &s.nkeys[i])
	} else {
		s.args = append(s.args, "evalsha", l.shaArg, &s.nkeys[i])
	}
	if merged {
		s.args = append(s.args, &c.parts[0].keys[0])
	} else {
		s.args = appendKeys(s.args, c.parts)
	}
	// Earlier calls' slices of s.blob stay valid when append moves it.
	b := len(s.blob)
	for d, p := range c.parts {
		for j := 0; j < len(p.args); j += argsPerKey {
			s.blob = appendArgs(s.blob, uint64(d+1), p.args[j:j+argsPerKey])
		}
	}
	s.args = append(s.args, s.blob[b:len(s.blob):len(s.blob)])
	if merged {
		s.args = appendKeys(s.args, c.parts)
	}
	end := len(s.args)
	cmd := goredis.NewCmd(ctx, s.args[start:end:end]...)
	cmd.SetFirstKeyPos(3) // Redis Cluster routes by the first key
	return cmd
}

// appendKeys appends the bucket keys of parts to args.
func appendKeys(args []any, parts []*part) []any {
	for _, p := range parts {
		for j := range p.keys {
			args = append(args, &p.keys[j])
		}
	}
	return args
}

// exec runs the commands of calls (only those to retry, when retry is set):
// one alone, several in one pipeline, which go-redis splits by cluster node.
// Errors stay in the commands.
func (l *Limiter) exec(ctx context.Context, calls []call, retry bool) {
	n, last := 0, -1
	for i := range calls {
		if !retry || calls[i].retry {
			n, last = n+1, i
		}
	}
	if n == 1 {
		_ = l.client.Process(ctx, calls[last].cmd)
		return
	}
	pipe := l.client.Pipeline()
	for i := range calls {
		if !retry || calls[i].retry {
			_ = pipe.Process(ctx, calls[i].cmd)
		}
	}
	_, _ = pipe.Exec(ctx)
}

// answerCall parses the reply of c into its parts and answers them; a
// failed call fails every part with the same error.
func (l *Limiter) answerCall(ctx context.Context, c *call) {
	err := c.cmd.Err()
	switch {
	case err != nil && isNotLocal(err):
		err = fmt.Errorf("backend/redis: token_bucket.lua: %w: %w", errNotLocal, err)
	case err != nil:
		err = classify(ctx, "token_bucket.lua", err)
	default:
		err = readReplies(c.cmd.Val(), c.parts)
	}
	for _, p := range c.parts {
		l.answer(p, err)
	}
}

// readReplies reads the reply of one script call into its parts.
func readReplies(v any, parts []*part) error {
	rd, err := newReplyReader(v)
	for _, p := range parts {
		if err != nil {
			break
		}
		err = rd.read(p.replies)
	}
	if err == nil {
		err = rd.end()
	}
	if err != nil {
		return fmt.Errorf("backend/redis: %w", err)
	}
	return nil
}
