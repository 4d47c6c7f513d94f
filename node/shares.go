package node

import (
	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/backend/share"
)

// shareMembership is the node registry as the standing shares read it:
// the n they are sized by, and whether this node may hold one.
//
// Temporary, until the registry says whether every live node counts this
// node: a node holds shares once a heartbeat has succeeded, sized by the
// live count plus one, for a node that joined since and that this count
// does not show yet.
func shareMembership(nodes *redisbackend.Nodes) share.Membership {
	return registryShares{nodes}
}

// registryShares is shareMembership's stand-in.
type registryShares struct{ nodes *redisbackend.Nodes }

// Share reports the live count plus one, once a heartbeat has succeeded.
func (r registryShares) Share() (int, bool) {
	if !r.nodes.Seen() {
		return 0, false
	}
	return r.nodes.Count() + 1, true
}
