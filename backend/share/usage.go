package share

import (
	"context"
	"errors"

	"github.com/sluice-rls/sluice/bucket"
)

// errNotCheck is ReadShares' error for a hit that would take or give.
var errNotCheck = errors.New("share: ReadShares takes checks only (Cost 0, no give)")

// ReadShares answers check-only hits (Cost 0, not a give) as Hit does,
// with each share hit's two parts apart, for the fleet's view (/usage):
// shares[i] is its share in millionths (0: none), states[i] is Redis'
// part alone, hits[i].Limit is set to that part's limit, and cells[i]
// and cellStates[i] are this node's share cell of it
// (cells[i].Burst 0: none, when the node holds no share now or the share
// is less than a token). A hit without a share is decided behind as it
// is, its cell empty. n is the node count shares are sized by, 0 while
// this node holds none. It takes nothing.
func (l *Limiter) ReadShares(ctx context.Context, hits []bucket.Hit, states []bucket.State, shares []uint32, cells []bucket.Limit, cellStates []bucket.State) (int, bucket.Decision, error) {
	for i := range hits {
		if hits[i].Cost != 0 || hits[i].Give {
			return 0, bucket.Decision{}, errNotCheck
		}
	}
	sc := l.get(len(hits))
	defer l.scratch.Put(sc)
	now := l.clock.Now()
	n, ok := l.opts.Membership.ShareAt(now)
	sc.since = l.since(n, ok) // a cell reads as Hit would find it
	if !ok {
		n = 0
	}
	l.plan(sc, hits, n, ok)
	l.cellCalls(sc, hits, now) // checks: they read their cell, take nothing
	l.innerHits(sc, hits)      // every check goes behind
	for i := range hits {
		p := &sc.plans[i]
		shares[i], cells[i], cellStates[i] = p.share, bucket.Limit{}, bucket.State{}
		if p.cellAt >= 0 {
			cells[i], cellStates[i] = p.cell, sc.cellStates[p.cellAt]
		}
		if p.share > 0 {
			hits[i].Limit = redisLimit(hits[i].Limit, p.share)
		}
	}
	if len(sc.inner) == 0 {
		return n, bucket.Decision{Allowed: true}, nil
	}
	sc.innerStates = grow(sc.innerStates, len(sc.inner))
	d, err := l.opts.Inner.Hit(ctx, sc.inner, sc.innerStates)
	if err != nil {
		return n, d, err
	}
	for i := range hits {
		if at := sc.plans[i].innerAt; at >= 0 {
			states[i] = sc.innerStates[at]
		}
	}
	return n, d, nil
}
