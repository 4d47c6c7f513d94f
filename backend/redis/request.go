package redis

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rls/sluice/bucket"
)

// request is one decision (a Hit call), or the refund of one, on its way to
// Redis: its hits split into parts, one per script call it needs (one per
// Redis Cluster master touched, or per slot after a stale slot map; one per
// bucket on a Ring; one in total on a single Redis). Requests are pooled, so
// that the steady path allocates little beyond the keys' string.
//
// Ownership. The caller and every unanswered part hold a reference (refs).
// A part is answered once (replies or err, then answered): by the sender
// from its call's reply, or by the batcher when it fails or skips the part
// unsent. The one answering the last part signals done before it drops its
// reference. The caller waits for done, or gives up at its deadline and
// marks the request abandoned (writers then skip its queued parts); whoever
// drops the last reference returns the request to its pool. So a request is
// never reused while a writer may still write into it, and writers never
// touch the caller's hits or states: a part carries copies of everything
// its call needs.
type request struct {
	pool  *sync.Pool // of the Limiter, where release returns it
	parts []*part    // len = parts in use; pooled parts beyond it
	keys  string     // the Redis key of every hit, keyspace.keyLen bytes each, back to back
	buf   []byte     // builds keys

	refs      atomic.Int32
	pending   atomic.Int32  // unanswered parts
	done      chan struct{} // one value when every part is answered
	abandoned atomic.Bool   // the caller gave up
	timer     *time.Timer   // the caller's deadline
	values    valuesOnly    // the caller's context for its inline call

	dec decision // the caller's side: read and written only by the caller
}

// decision is the caller's view of one Hit call.
type decision struct {
	hits   []bucket.Hit
	states []bucket.State
	// local marks hits decided on the node, not sent to Redis. Most
	// requests carry few descriptors, so the mask lives in a word.
	local uint64
	many  map[int]bool // the mask beyond 64 hits
	// refused: a hit decided on the node refused the decision, so the
	// parts sent only report the other takes' buckets (part.refuse).
	refused bool
}

func (d *decision) setLocal(i int) {
	if i < 64 {
		d.local |= 1 << i
		return
	}
	if d.many == nil {
		d.many = make(map[int]bool)
	}
	d.many[i] = true
}

func (d *decision) isLocal(i int) bool {
	if i < 64 {
		return d.local&(1<<i) != 0
	}
	return d.many[i]
}

// part is the hits of one request for one script call: all on one cluster
// master, in any slot or in one (routeSlot), or one bucket (routeKey). In a
// call, several requests' parts follow each other, each its own
// all-or-nothing decision.
type part struct {
	req    *request
	queue  *queue     // the queue of its server
	slot   int        // cluster slot of every key, or anySlot (routeSlot)
	bucket bucket.Key // the only bucket (routeKey)

	keys    []string   // substrings of req.keys
	args    []uint64   // argsPerKey per key
	refs    []int      // index of each key's hit in its decision
	replies []keyReply // written by the sender

	err      error       // written by whoever answers the part
	answered atomic.Bool // replies and err are final
	refunded bool        // the caller gave its takes back (caller only)
	refused  bool        // refuse added its entry: the takes took nothing
}

// newRequest returns a request that release returns to pool.
func newRequest(pool *sync.Pool) *request {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &request{pool: pool, done: make(chan struct{}, 1), timer: t}
}

// reset prepares a pooled request for a new decision.
func (r *request) reset() {
	r.parts = r.parts[:0]
	r.keys = ""
	r.abandoned.Store(false)
	select {
	case <-r.done: // signalled after its last user had left
	default:
	}
	if r.dec.many != nil {
		clear(r.dec.many)
	}
	r.dec = decision{many: r.dec.many}
}

// newPart returns an empty part of r, reusing a pooled one.
func (r *request) newPart() *part {
	n := len(r.parts)
	if n < cap(r.parts) {
		r.parts = r.parts[:n+1]
	} else {
		r.parts = append(r.parts, nil)
	}
	p := r.parts[n]
	if p == nil {
		p = &part{req: r}
		r.parts[n] = p
	}
	p.queue, p.slot, p.bucket = nil, 0, bucket.Key{}
	p.keys, p.args, p.refs, p.replies = p.keys[:0], p.args[:0], p.refs[:0], p.replies[:0]
	p.err, p.refunded, p.refused = nil, false, false
	p.answered.Store(false)
	return p
}

// add appends hit h, the ref-th of its decision, under key.
func (p *part) add(key string, h *bucket.Hit, ref, flags int) {
	period := max(uint64(h.Limit.Period/time.Microsecond), 1)
	p.keys = append(p.keys, key)
	p.args = append(p.args, period, h.Limit.Requests, h.Limit.Burst, h.Cost, uint64(flags))
	p.refs = append(p.refs, ref)
	p.replies = append(p.replies, keyReply{})
}

// refuse makes the part's decision one the script refuses whatever its
// buckets hold, so that its takes take nothing and report their buckets
// untouched, as the script reports the allowed takes of a refused
// decision: it appends a take of Requests 0 (refused by the script alone,
// and writing nothing) on the part's first key, so in its slot and on its
// bucket. Its reply has no hit (ref -1). Gives and independent hits of the
// part are applied as in any decision.
func (p *part) refuse() {
	if len(p.keys) == 0 || p.refused {
		return
	}
	p.refused = true
	p.keys = append(p.keys, p.keys[0])
	p.args = append(p.args, 1, 0, 0, 0, 0) // period 1µs, requests 0, burst 0, cost 0, take
	p.refs = append(p.refs, -1)
	p.replies = append(p.replies, keyReply{})
}

// took reports whether part p took tokens for the decision's takes: every
// take in it was allowed (a part is all-or-nothing) and one cost something.
// p must be answered without error.
func (p *part) took(d *decision) bool {
	if p.refused {
		return false
	}
	spent := false
	for j, i := range p.refs {
		h := &d.hits[i]
		if !isTake(h) {
			continue
		}
		if !p.replies[j].allowed {
			return false
		}
		spent = spent || h.Cost > 0
	}
	return spent
}

// fill writes the states of the part's hits and reports whether all its
// takes were allowed.
func (p *part) fill(d *decision) bool {
	ok := !p.refused
	for j, i := range p.refs {
		if i < 0 {
			continue // refuse's entry
		}
		r := &p.replies[j]
		d.states[i] = bucket.State{
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

// isTake reports whether h is part of the all-or-nothing set of a decision.
func isTake(h *bucket.Hit) bool { return !h.Give && !h.Independent }

func flags(h *bucket.Hit) int {
	f := 0
	if h.Give {
		f |= flagGive
	}
	if h.Independent {
		f |= flagIndependent
		if h.Overdraw && !h.Give {
			f |= flagOverdraw
		}
	}
	return f
}

// expect readies r for the answers of its parts: each holds a reference
// until it is answered.
func (r *request) expect() {
	n := int32(len(r.parts))
	r.pending.Store(n)
	r.refs.Add(n)
}

// answer records the part's answer and drops its reference to its request;
// the last part answered wakes the caller.
func (p *part) answer(err error) {
	r := p.req
	p.err = err
	p.answered.Store(true)
	if r.pending.Add(-1) == 0 {
		r.done <- struct{}{}
	}
	r.release()
}

// release drops a reference to r, pooling it after the last.
func (r *request) release() {
	if r.refs.Add(-1) == 0 {
		r.pool.Put(r)
	}
}

// valuesOnly is a context with the values of the one it holds but neither
// its deadline nor its cancellation: context.WithoutCancel without the
// allocation, as it lives in a pooled request.
type valuesOnly struct{ context.Context }

// Deadline reports no deadline.
func (*valuesOnly) Deadline() (time.Time, bool) { return time.Time{}, false }

// Done returns nil: a valuesOnly is never cancelled.
func (*valuesOnly) Done() <-chan struct{} { return nil }

// Err returns nil.
func (*valuesOnly) Err() error { return nil }
