package redis

import (
	"context"
	_ "embed" // lease.lua
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/backend/leaseproto"
)

// leaseLua is the script of the leased global layer (package
// backend/lease); its header documents KEYS, ARGV and the reply.
//
//go:embed lease.lua
var leaseLua string

// leaseScript is immutable: the script's source and SHA-1.
var leaseScript = goredis.NewScript(leaseLua)

// leaseArgs is the number of doubles per key of lease.lua's ARGV[1].
const leaseArgs = 12

// leaseReplyBytes is the size of lease.lua's reply per key: six doubles.
const leaseReplyBytes = 8 * 6

// ErrLeaseSlots is returned by Lease on a Ring for a decision of several
// keys, which one script call cannot decide all-or-nothing.
var ErrLeaseSlots = errors.New("backend/redis: a leased decision spans Ring shards")

// Lease runs ops through lease.lua and writes one reply per op into out.
// Its buckets are not token_bucket.lua's: their keys are
// "<prefix>:lease:{<hash>}", so a rule switched between exact and leased
// starts from a full bucket. A leased bucket records the limit it was last
// written under and an op under another limit converts it, as
// token_bucket.lua's buckets (lease.lua's header).
//
// On a single Redis (or sentinel master) it is one script call. In Redis
// Cluster it is one call per master touched, concurrently, as Hit's: the
// bucket keys travel in ARGV (lease.lua's header), so one call serves every
// slot its master holds, by the client's slot map. A decision spanning
// masters is decided on each, and where one refuses, the takes the others
// allowed give back what they took and leased, in a second round of calls
// (one per master again); their replies then report the bucket after the
// refund, and nothing leased. When a call reaches a master that no longer
// serves one of its buckets (a stale slot map, while slots move), lease.lua
// fails before writing anything, and that call's ops go again one call per
// slot, which go-redis redirects (MOVED, ASK). On a Ring it is one call per
// key, and every decision must have one key (ErrLeaseSlots). Every call
// runs under the Timeout, not ctx's deadline. Errors are classified as
// Hit's (ErrorKind).
func (l *Limiter) Lease(ctx context.Context, ops []leaseproto.Op, out []leaseproto.Reply) error {
	if len(out) < len(ops) {
		return fmt.Errorf("backend/redis: %d replies for %d lease ops", len(out), len(ops))
	}
	if l.client == nil {
		return errors.New("backend/redis: Options.Client is nil")
	}
	if len(ops) == 0 {
		return nil
	}
	if l.route == routeKey {
		for i := 1; i < len(ops); i++ {
			if ops[i].Decision == ops[i-1].Decision && ops[i].Key != ops[i-1].Key {
				return fmt.Errorf("backend/redis: a leased decision names several keys on a Ring: %w", ErrLeaseSlots)
			}
		}
	}
	ks := newKeyspace(l.keys.prefix + ":lease")
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.timeout)
	defer cancel()
	call, err := l.leaseRun(cctx, ks, ops, out)
	if err != nil {
		return err
	}
	if l.route == routeSlot {
		return l.leaseRefund(cctx, ks, ops, out, call)
	}
	return nil
}

// leaseGroup is the ops of one lease.lua call.
type leaseGroup struct {
	idx []int // indexes of the ops, in order
	// merged: the call serves several slots of one master, its bucket keys
	// in ARGV (KEYS[1] only routes it).
	merged bool
	err    error // the call's, unclassified
}

// leaseRun runs ops in as few lease.lua calls as the routing allows,
// concurrently, and returns the call that decided each op (an index: ops
// of one call were decided all-or-nothing per decision). In Redis Cluster
// a master's call refused as non-local (a stale slot map) goes again one
// call per slot.
func (l *Limiter) leaseRun(ctx context.Context, ks keyspace, ops []leaseproto.Op, out []leaseproto.Reply) ([]int, error) {
	call := make([]int, len(ops))
	var groups []leaseGroup
	switch l.route {
	case routeSlot:
		byMaster := map[string]int{}
		for i := range ops {
			m, err := l.cluster.MasterForKey(ctx, string(ks.appendKey(nil, ops[i].Key)))
			if err != nil {
				return nil, classify(ctx, "cluster slots", err)
			}
			g, ok := byMaster[m.Options().Addr]
			if !ok {
				g = len(groups)
				byMaster[m.Options().Addr] = g
				groups = append(groups, leaseGroup{merged: true})
			}
			groups[g].idx = append(groups[g].idx, i)
			call[i] = g
		}
	case routeKey:
		// One call per op, but the ops of a decision (on one key) together.
		for i := range ops {
			if i == 0 || ops[i].Decision != ops[i-1].Decision {
				groups = append(groups, leaseGroup{})
			}
			g := len(groups) - 1
			groups[g].idx = append(groups[g].idx, i)
			call[i] = g
		}
	default:
		groups = []leaseGroup{{idx: make([]int, len(ops))}}
		for i := range ops {
			groups[0].idx[i] = i
		}
	}
	l.leaseGroups(ctx, ks, ops, out, groups)

	// A stale slot map: nothing was written on the master that refused.
	// Its ops go again, one call per slot.
	var again []leaseGroup
	for g := range groups {
		if !groups[g].merged || groups[g].err == nil || !isNotLocal(groups[g].err) {
			continue
		}
		groups[g].err = nil
		bySlot := map[int]int{}
		for _, i := range groups[g].idx {
			s := slot(fmt.Appendf(nil, "%x", ops[i].Key[:]))
			n, ok := bySlot[s]
			if !ok {
				n = len(again)
				bySlot[s] = n
				again = append(again, leaseGroup{})
			}
			again[n].idx = append(again[n].idx, i)
			call[i] = len(groups) + n
		}
	}
	if len(again) > 0 {
		l.cluster.ReloadState(ctx)
		l.leaseGroups(ctx, ks, ops, out, again)
		groups = append(groups, again...)
	}
	var errs []error
	for _, g := range groups {
		if g.err != nil {
			errs = append(errs, classify(ctx, "lease.lua", g.err))
		}
	}
	return call, errors.Join(errs...)
}

// leaseGroups runs one script call per group, concurrently, and records
// each call's error in its group.
func (l *Limiter) leaseGroups(ctx context.Context, ks keyspace, ops []leaseproto.Op, out []leaseproto.Reply, groups []leaseGroup) {
	if len(groups) == 1 {
		groups[0].err = l.leaseCall(ctx, ks, ops, groups[0].idx, groups[0].merged, out)
		return
	}
	var wg sync.WaitGroup
	for n := range groups {
		g := &groups[n]
		wg.Go(func() { g.err = l.leaseCall(ctx, ks, ops, g.idx, g.merged, out) })
	}
	wg.Wait()
}

// leaseRefund completes the all-or-nothing of decisions that span Redis
// Cluster calls (masters, or slots after a stale slot map), which each call
// decided alone: where any take of a decision was refused, the takes that
// other calls allowed give back what they took and leased, in a second
// round of calls; their replies then report the bucket after the refund,
// and nothing leased. A call that refused a take of the decision took
// nothing for it (its takes that were allowed alone included), so it gives
// nothing back.
func (l *Limiter) leaseRefund(ctx context.Context, ks keyspace, ops []leaseproto.Op, out []leaseproto.Reply, call []int) error {
	var gives []leaseproto.Op
	var refs []int
	var refused []int // calls that refused a take of the decision
	for i := 0; i < len(ops); {
		j := i
		refused = refused[:0]
		for j < len(ops) && ops[j].Decision == ops[i].Decision {
			if ops[j].Kind == leaseproto.Take && !out[j].Allowed && !slices.Contains(refused, call[j]) {
				refused = append(refused, call[j])
			}
			j++
		}
		for k := i; len(refused) > 0 && k < j; k++ {
			if ops[k].Kind == leaseproto.Take && out[k].Allowed && !slices.Contains(refused, call[k]) && ops[k].Take+out[k].Leased > 0 {
				// The lease goes back as a return that unparks it, the
				// take as a give.
				if out[k].Leased > 0 {
					gives = append(gives, leaseproto.Op{Key: ops[k].Key, Limit: ops[k].Limit, Decision: uint64(len(gives) + 1), Kind: leaseproto.Return,
						Take: out[k].Leased, Window: ops[k].Window, Since: out[k].Granted, Unpark: out[k].Leased})
					refs = append(refs, -1)
				}
				gives = append(gives, leaseproto.Op{Key: ops[k].Key, Limit: ops[k].Limit, Decision: uint64(len(gives) + 1), Kind: leaseproto.Give, Take: ops[k].Take, Window: ops[k].Window})
				refs = append(refs, k)
			}
		}
		i = j
	}
	if len(gives) == 0 {
		return nil
	}
	replies := make([]leaseproto.Reply, len(gives))
	if _, err := l.leaseRun(ctx, ks, gives, replies); err != nil {
		return fmt.Errorf("backend/redis: refund of a leased decision refused on another master: %w", err)
	}
	for n, k := range refs {
		if k < 0 {
			continue
		}
		out[k].Leased, out[k].Granted = 0, 0
		out[k].Remaining, out[k].Reset = replies[n].Remaining, replies[n].Reset
	}
	return nil
}

// leaseCall runs one script call for ops[idx]: with their bucket keys as
// KEYS, or, merged, in ARGV after the arguments, KEYS[1] routing the call.
// It returns the call's error unclassified.
func (l *Limiter) leaseCall(ctx context.Context, ks keyspace, ops []leaseproto.Op, idx []int, merged bool, out []leaseproto.Reply) error {
	keys := make([]string, len(idx))
	args := make([]byte, 0, 8*leaseArgs*len(idx))
	for j, i := range idx {
		op := &ops[i]
		keys[j] = string(ks.appendKey(nil, op.Key))
		share := max(op.Share, 1)
		for _, v := range [leaseArgs]uint64{
			op.Decision, uint64(op.Limit.Period / time.Microsecond), op.Limit.Requests, op.Limit.Burst,
			op.Need, op.Take, op.Extra, share, leaseFlags(op),
			uint64(op.Window / time.Microsecond), op.Since, op.Unpark,
		} {
			args = binary.LittleEndian.AppendUint64(args, math.Float64bits(float64(v)))
		}
	}
	var v any
	var err error
	if merged {
		argv := make([]any, 1, 1+len(keys))
		argv[0] = string(args)
		for _, k := range keys {
			argv = append(argv, k)
		}
		v, err = leaseScript.Run(ctx, l.client, keys[:1], argv...).Result()
	} else {
		v, err = leaseScript.Run(ctx, l.client, keys, string(args)).Result()
	}
	if err != nil {
		return err
	}
	s, ok := v.(string)
	if !ok || len(s) != leaseReplyBytes*len(idx) {
		return fmt.Errorf("%w: lease.lua reply is %T of %d bytes, want %d", ErrScript, v, len(s), leaseReplyBytes*len(idx))
	}
	for j, i := range idx {
		var f [leaseReplyBytes / 8]uint64
		for k := range f {
			x := math.Float64frombits(le64(s[leaseReplyBytes*j+8*k:]))
			if !(x >= 0 && x <= maxReplyValue) || x != math.Trunc(x) {
				return fmt.Errorf("%w: lease.lua reply value %d of key %d is %v", ErrScript, k+1, j+1, x)
			}
			f[k] = uint64(x)
		}
		out[i] = leaseproto.Reply{
			Allowed:   f[0] == 1,
			Leased:    f[1],
			Remaining: f[2],
			Retry:     time.Duration(f[3]) * time.Microsecond,
			Reset:     time.Duration(f[4]) * time.Microsecond,
			Granted:   f[5],
		}
	}
	return nil
}

// leaseFlags is op's flags as lease.lua reads them: its Kind, and 6 for an
// independent take that overdraws.
func leaseFlags(op *leaseproto.Op) uint64 {
	if op.Overdraw && op.Kind == leaseproto.Independent {
		return 6
	}
	return uint64(op.Kind)
}
