package fallback

import (
	"context"
	"slices"

	"github.com/sluice-rls/sluice/bucket"
)

// track charges this node's share buckets with what Primary just decided
// (d, states) for hits: the takes it admitted and the gives. The share so
// reflects the node's own recent use of each global limit, and a request
// answered from it — one that timed out without switching the node, or
// the first ones after a switch — finds only the part of burst/N and
// rate/N that the node has not already spent through Redis, not a full
// burst/N on top of Redis' count. Each hit is charged on its own
// (Independent): a share already spent stays empty and blocks nothing.
func (l *Limiter) track(ctx context.Context, hits []bucket.Hit, states []bucket.State, d bucket.Decision) {
	n := max(l.opts.Nodes(), 1)
	bp := l.scratch.Get().(*[]bucket.Hit)
	charged := (*bp)[:0]
	for i, h := range hits {
		switch {
		case h.Give:
		case h.Independent && states[i].Allowed, !h.Independent && d.Allowed:
			h.Independent = true
		default:
			continue // not taken in Redis
		}
		h.Limit = share(h.Limit, n)
		charged = append(charged, h)
	}
	if len(charged) > 0 {
		sp := l.states.Get().(*[]bucket.State)
		st := slices.Grow((*sp)[:0], len(charged))[:len(charged)]
		// An error of the memory buckets (full) only leaves a share
		// untracked: the decision is Primary's.
		_, _ = l.opts.Share.Hit(ctx, charged, st)
		*sp = st
		l.states.Put(sp)
	}
	*bp = charged
	l.scratch.Put(bp)
}
