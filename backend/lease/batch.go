package lease

import (
	"context"
	"sync"

	"github.com/sluice-rls/sluice/backend/leaseproto"
)

// batcher shares Lease calls among concurrent decisions, as backend/redis
// shares token_bucket.lua calls: a decision that finds no call in flight
// sends its own at once; the ones arriving meanwhile queue, and one writer
// goroutine sends everything queued in one call when the call in flight
// ends, until the queue is empty (then it exits). A waiting decision waits
// for its call, which the Leaser bounds by its timeout. (backend/redis's
// batcher is built around token_bucket.lua's parts and pooled requests;
// this one is small enough to keep separate.)
type batcher struct {
	leaser Leaser

	mu    sync.Mutex
	busy  bool
	queue []*pending
	wg    sync.WaitGroup // the writer
}

// pending is one queued decision.
type pending struct {
	ops  []leaseproto.Op
	out  []leaseproto.Reply
	done chan error
}

// do runs ops through the Leaser, alone or in a shared call.
func (b *batcher) do(ctx context.Context, ops []leaseproto.Op, out []leaseproto.Reply) error {
	b.mu.Lock()
	if !b.busy {
		b.busy = true
		b.mu.Unlock()
		err := b.leaser.Lease(ctx, ops, out)
		b.next()
		return err
	}
	p := &pending{ops: ops, out: out, done: make(chan error, 1)}
	b.queue = append(b.queue, p)
	b.mu.Unlock()
	return <-p.done
}

// next hands the queue to a writer, or frees the batcher.
func (b *batcher) next() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.queue) == 0 {
		b.busy = false
		return
	}
	b.wg.Add(1)
	go b.write()
}

// write sends the queue, one call per round, until it is empty.
func (b *batcher) write() {
	defer b.wg.Done()
	for {
		b.mu.Lock()
		batch := b.queue
		b.queue = nil
		if len(batch) == 0 {
			b.busy = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		var ops []leaseproto.Op
		dec := uint64(0)
		for _, p := range batch {
			for i, op := range p.ops {
				if i == 0 || op.Decision != p.ops[i-1].Decision {
					dec++ // decisions of different requests stay apart
				}
				op.Decision = dec
				ops = append(ops, op)
			}
		}
		out := make([]leaseproto.Reply, len(ops))
		err := b.leaser.Lease(context.Background(), ops, out)
		at := 0
		for _, p := range batch {
			copy(p.out, out[at:at+len(p.ops)])
			at += len(p.ops)
			p.done <- err
		}
	}
}

// wait waits for the writer to exit.
func (b *batcher) wait() { b.wg.Wait() }
