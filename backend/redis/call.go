package redis

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"

	goredis "github.com/redis/go-redis/v9"
)

// sender makes a Limiter's script calls: its send is the batcher's
// sendFunc. It turns parts into token_bucket.lua calls, sends them at once
// (one pipeline when there are several), and answers every part from the
// replies.
type sender struct {
	client goredis.UniversalClient
	route  routing
	// shaArg and srcArg are the script's SHA-1 and source, converted to
	// interfaces once rather than per call.
	shaArg, srcArg any
	bufs           sync.Pool // *sendBuf
}

// sendBuf is the scratch of one send. It is pooled, so a call's arguments
// cost no allocation: keys and numbers go to go-redis as pointers into the
// parts, which an interface holds without boxing.
type sendBuf struct {
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

// newSender returns the sender of script calls through client, routed as
// route says.
func newSender(client goredis.UniversalClient, route routing) *sender {
	s := &sender{
		client: client,
		route:  route,
		shaArg: goredis.NewScript(tokenBucketLua).Hash(),
		srcArg: tokenBucketLua,
	}
	s.bufs.New = func() any { return new(sendBuf) }
	return s
}

// send sends parts in as few script calls as the routing allows, all at
// once (one pipeline when there are several), under ctx, and answers every
// part. It is a sendFunc.
func (s *sender) send(ctx context.Context, parts []*part) {
	if s.route != routeOne && len(parts) > 1 {
		slices.SortFunc(parts, func(a, b *part) int {
			return cmp.Or(cmp.Compare(a.slot, b.slot), bytes.Compare(a.bucket[:], b.bucket[:]))
		})
	}
	b := s.bufs.Get().(*sendBuf)
	b.calls, b.args, b.blob = b.calls[:0], b.args[:0], b.blob[:0]
	start := 0
	for i := 1; i <= len(parts); i++ {
		if i == len(parts) || parts[i].slot != parts[start].slot || parts[i].bucket != parts[start].bucket {
			b.calls = append(b.calls, call{parts: parts[start:i]})
			start = i
		}
	}
	if cap(b.nkeys) < len(b.calls) {
		b.nkeys = make([]uint64, len(b.calls))
	}
	b.nkeys = b.nkeys[:len(b.calls)]
	for i := range b.calls {
		b.calls[i].cmd = b.build(ctx, i, "evalsha", s.shaArg)
	}
	s.exec(ctx, b.calls, false)

	// After a Redis restart or failover flushed the script cache: EVAL loads
	// the script and runs it; later calls find it again.
	retry := false
	for i := range b.calls {
		c := &b.calls[i]
		err := c.cmd.Err()
		c.retry = err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT")
		if c.retry {
			c.cmd = b.build(ctx, i, "eval", s.srcArg)
			retry = true
		}
	}
	if retry {
		s.exec(ctx, b.calls, true)
	}

	for i := range b.calls {
		answerCall(ctx, &b.calls[i])
		b.calls[i] = call{}
	}
	clear(b.args)
	s.bufs.Put(b)
}

// build returns the command of call i, name ("evalsha" or "eval") with
// script (the SHA-1 or the source), with the keys and arguments of its
// parts, numbered as decisions 1, 2, ... Name and script come as interfaces
// already, as the arguments take them, so that building allocates nothing.
func (b *sendBuf) build(ctx context.Context, i int, name, script any) *goredis.Cmd {
	c := &b.calls[i]
	merged := c.parts[0].slot == anySlot
	keys := 0
	for _, p := range c.parts {
		keys += len(p.keys)
	}
	b.nkeys[i] = uint64(keys)
	if merged {
		b.nkeys[i] = 1 // KEYS[1] routes; the bucket keys follow ARGV[1]
	}
	start := len(b.args)
	b.args = append(b.args, name, script, &b.nkeys[i])
	if merged {
		b.args = append(b.args, &c.parts[0].keys[0])
	} else {
		b.args = appendKeys(b.args, c.parts)
	}
	// Earlier calls' slices of b.blob stay valid when append moves it.
	at := len(b.blob)
	for d, p := range c.parts {
		for j := 0; j < len(p.args); j += argsPerKey {
			b.blob = appendArgs(b.blob, uint64(d+1), p.args[j:j+argsPerKey])
		}
	}
	b.args = append(b.args, b.blob[at:len(b.blob):len(b.blob)])
	if merged {
		b.args = appendKeys(b.args, c.parts)
	}
	end := len(b.args)
	cmd := goredis.NewCmd(ctx, b.args[start:end:end]...)
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
func (s *sender) exec(ctx context.Context, calls []call, retry bool) {
	n, last := 0, -1
	for i := range calls {
		if !retry || calls[i].retry {
			n, last = n+1, i
		}
	}
	if n == 1 {
		_ = s.client.Process(ctx, calls[last].cmd)
		return
	}
	pipe := s.client.Pipeline()
	for i := range calls {
		if !retry || calls[i].retry {
			_ = pipe.Process(ctx, calls[i].cmd)
		}
	}
	_, _ = pipe.Exec(ctx)
}

// answerCall parses the reply of c into its parts and answers them; a
// failed call fails every part with the same error.
func answerCall(ctx context.Context, c *call) {
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
		p.answer(err)
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
