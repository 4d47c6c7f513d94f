package fallback

import (
	"context"
	"slices"

	"github.com/sluice-rls/sluice/bucket"
)

// track charges this node's share buckets with the hits it just sent to
// Primary: every take, admitted or not, and every give. The share so
// follows the node's own recent demand on each global limit, and a request
// answered from it — one that timed out without switching the node, or the
// first ones after a switch — finds only the part of burst/N and rate/N
// that the node has not already asked Redis for, not a full burst/N on top
// of Redis' count. Charging admitted takes alone did not hold: a take
// finding the share empty is lost, not owed, so the share drifted back to
// full while Redis refused the node. Each hit is charged on its own
// (Independent): a share already spent stays empty and blocks nothing.
func (l *Limiter) track(ctx context.Context, hits []bucket.Hit) {
	n := max(l.opts.Nodes(), 1)
	bp := l.scratch.Get().(*[]bucket.Hit)
	charged := append((*bp)[:0], hits...)
	for i := range charged {
		charged[i].Independent = !charged[i].Give
		charged[i].Limit = share(charged[i].Limit, n)
	}
	sp := l.states.Get().(*[]bucket.State)
	st := slices.Grow((*sp)[:0], len(charged))[:len(charged)]
	// An error of the memory buckets (full) only leaves a share untracked:
	// the decision is Primary's.
	_, _ = l.opts.Share.Hit(ctx, charged, st)
	*sp = st
	l.states.Put(sp)
	*bp = charged
	l.scratch.Put(bp)
}
