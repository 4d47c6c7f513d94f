package redis

import (
	"context"
	_ "embed" // lease.lua
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/bucket"
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

// LeaseKind says what a LeaseOp does.
type LeaseKind uint8

const (
	// LeaseTake takes Take tokens when Need exist, all-or-nothing with the
	// other LeaseTake ops of its decision, then leases up to Extra more.
	LeaseTake LeaseKind = iota
	// LeaseGive gives Take tokens back: never above the burst minus the
	// tokens the bucket counts as parked in leases (lease.lua's header), so
	// that the fleet's bucket (Redis' plus the leases) stays within the
	// burst, as exact mode's.
	LeaseGive
	// LeaseIndependent is a LeaseTake decided alone (a shadow-mode hit, or a
	// prefetch with Need 0, which is always allowed).
	LeaseIndependent
	// LeaseReturn closes a node's pool of leased tokens: it takes the
	// pool's Unpark granted tokens (first granted at Since) out of the
	// bucket's count of parked tokens, then gives back Take tokens leased
	// under Limit as a LeaseGive, except that the give does nothing when
	// the bucket was written under another limit since (those tokens are
	// lost, never admitted: giving them back would convert the bucket to
	// the old limit, whose clamp may forget tokens the fleet spent).
	LeaseReturn
)

// LeaseOp is one bucket operation of a call of Limiter.Lease. Ops with the
// same Decision number next to each other form one decision.
type LeaseOp struct {
	Key      bucket.Key
	Limit    bucket.Limit
	Decision uint64
	Kind     LeaseKind
	// Need is how many tokens must exist for a take to be allowed; Take how
	// many it takes then (Take ≤ Need), or how many a give gives back.
	Need, Take uint64
	// Extra bounds the tokens leased beyond Take once the decision is
	// allowed; they are at most the tokens then left divided by Share.
	Extra, Share uint64
	// Window is the longest that tokens this op leases may stay parked
	// on the node (spent or not): the bucket counts them as parked for at
	// least that long. Zero: until the bucket's value expires.
	Window time.Duration
	// Since and Unpark are a LeaseReturn's pool: when its first grant was
	// made (LeaseReply.Granted) and how many tokens it was granted in all.
	Since, Unpark uint64
}

// LeaseReply is lease.lua's answer for one LeaseOp.
type LeaseReply struct {
	Allowed bool
	// Leased is the number of tokens leased beyond Take.
	Leased uint64
	// Remaining is the number of whole tokens left in Redis' bucket.
	Remaining uint64
	// Retry is, for a refused take, the time until Need tokens exist.
	Retry time.Duration
	// Reset is the time until Redis' bucket is full, on Redis' clock.
	Reset time.Duration
	// Granted is, when Leased > 0, Redis' clock at the grant in
	// microseconds: a LeaseReturn's Since.
	Granted uint64
}

// ErrLeaseSlots is returned by Lease on a Ring for a decision of several
// keys, which one script call cannot decide all-or-nothing.
var ErrLeaseSlots = errors.New("backend/redis: a leased decision spans Ring shards")

// Lease runs ops through lease.lua and writes one reply per op into out.
// Its buckets are not token_bucket.lua's: their keys are
// "<prefix>:lease:{<hash>}", so a rule switched between exact and leased
// starts from a full bucket. A leased bucket records the limit it was last
// written under and an op under another limit converts it, as
// token_bucket.lua's buckets (lease.lua's header). On a single Redis (or sentinel master) it is
// one script call; in Redis Cluster one per slot, concurrently (a decision
// spanning slots is decided in each, and where one slot refuses, the
// others give back what they took, in a second round); on a Ring one per
// key, and every decision must have one key (ErrLeaseSlots). Every call runs under the
// Timeout, not ctx's deadline. Errors are classified as Hit's (ErrorKind).
func (l *Limiter) Lease(ctx context.Context, ops []LeaseOp, out []LeaseReply) error {
	if len(out) < len(ops) {
		return fmt.Errorf("backend/redis: %d replies for %d lease ops", len(out), len(ops))
	}
	if l.client == nil {
		return errors.New("backend/redis: Options.Client is nil")
	}
	if len(ops) == 0 {
		return nil
	}
	ks := newKeyspace(l.keys.prefix + ":lease")
	groups := map[int][]int{} // by slot (or key index on a Ring): op indexes
	var order []int
	group := func(i int) (int, error) {
		switch l.route {
		case routeSlot:
			return slot(fmt.Appendf(nil, "%x", ops[i].Key[:])), nil
		case routeKey:
			return i, nil
		default:
			return 0, nil
		}
	}
	spans := false // a decision spans cluster slots
	for i := range ops {
		g, err := group(i)
		if err != nil {
			return err
		}
		if i > 0 && ops[i].Decision == ops[i-1].Decision {
			prev, _ := group(i - 1)
			if prev != g {
				if l.route == routeKey {
					g = prev // a Ring decision on one key only: checked below
					if ops[i].Key != ops[i-1].Key {
						return fmt.Errorf("backend/redis: a leased decision names several keys on a Ring: %w", ErrLeaseSlots)
					}
				} else {
					spans = true
				}
			}
		}
		if _, ok := groups[g]; !ok {
			order = append(order, g)
		}
		groups[g] = append(groups[g], i)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.timeout)
	defer cancel()
	if err := l.leaseGroups(cctx, ks, ops, out, groups, order); err != nil {
		return err
	}
	if spans {
		return l.leaseRefund(cctx, ks, ops, out, group)
	}
	return nil
}

// leaseGroups runs one script call per group, concurrently.
func (l *Limiter) leaseGroups(ctx context.Context, ks keyspace, ops []LeaseOp, out []LeaseReply, groups map[int][]int, order []int) error {
	errs := make([]error, len(order))
	var wg sync.WaitGroup
	for n, g := range order {
		idx := groups[g]
		run := func() { errs[n] = l.leaseCall(ctx, ks, ops, idx, out) }
		if len(order) == 1 {
			run()
			break
		}
		wg.Go(run)
	}
	wg.Wait()
	return errors.Join(errs...)
}

// leaseRefund completes the all-or-nothing of decisions that span Redis
// Cluster slots, which each slot's call decided alone: where any take of a
// decision was refused, the takes other slots allowed give back what they
// took and leased, in a second round of calls; their replies then report
// the bucket after the refund, and nothing leased.
func (l *Limiter) leaseRefund(ctx context.Context, ks keyspace, ops []LeaseOp, out []LeaseReply, group func(int) (int, error)) error {
	var gives []LeaseOp
	var refs []int
	for i := 0; i < len(ops); {
		j := i
		refused := false
		for j < len(ops) && ops[j].Decision == ops[i].Decision {
			if ops[j].Kind == LeaseTake && !out[j].Allowed {
				refused = true
			}
			j++
		}
		for k := i; refused && k < j; k++ {
			if ops[k].Kind == LeaseTake && out[k].Allowed && ops[k].Take+out[k].Leased > 0 {
				// The lease goes back as a return that unparks it, the
				// take as a give.
				if out[k].Leased > 0 {
					gives = append(gives, LeaseOp{Key: ops[k].Key, Limit: ops[k].Limit, Decision: uint64(len(gives) + 1), Kind: LeaseReturn,
						Take: out[k].Leased, Window: ops[k].Window, Since: out[k].Granted, Unpark: out[k].Leased})
					refs = append(refs, -1)
				}
				gives = append(gives, LeaseOp{Key: ops[k].Key, Limit: ops[k].Limit, Decision: uint64(len(gives) + 1), Kind: LeaseGive, Take: ops[k].Take, Window: ops[k].Window})
				refs = append(refs, k)
			}
		}
		i = j
	}
	if len(gives) == 0 {
		return nil
	}
	groups := map[int][]int{}
	var order []int
	for i := range gives {
		g := slot(fmt.Appendf(nil, "%x", gives[i].Key[:]))
		if _, ok := groups[g]; !ok {
			order = append(order, g)
		}
		groups[g] = append(groups[g], i)
	}
	replies := make([]LeaseReply, len(gives))
	if err := l.leaseGroups(ctx, ks, gives, replies, groups, order); err != nil {
		return fmt.Errorf("backend/redis: refund of a leased decision refused in another slot: %w", err)
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

// leaseCall runs one script call for ops[idx].
func (l *Limiter) leaseCall(ctx context.Context, ks keyspace, ops []LeaseOp, idx []int, out []LeaseReply) error {
	keys := make([]string, len(idx))
	args := make([]byte, 0, 8*leaseArgs*len(idx))
	for j, i := range idx {
		op := &ops[i]
		keys[j] = string(ks.appendKey(nil, op.Key))
		share := max(op.Share, 1)
		for _, v := range [leaseArgs]uint64{
			op.Decision, uint64(op.Limit.Period / time.Microsecond), op.Limit.Requests, op.Limit.Burst,
			op.Need, op.Take, op.Extra, share, uint64(op.Kind),
			uint64(op.Window / time.Microsecond), op.Since, op.Unpark,
		} {
			args = binary.LittleEndian.AppendUint64(args, math.Float64bits(float64(v)))
		}
	}
	v, err := leaseScript.Run(ctx, l.client, keys, string(args)).Result()
	if err != nil {
		return classify(ctx, "lease.lua", err)
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
		out[i] = LeaseReply{
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
