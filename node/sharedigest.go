package node

import (
	"github.com/prometheus/client_golang/prometheus"

	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/ruleset"
)

// watchShareDigest keeps the share digest nodes publishes that of the
// rules in store as the service resolves their shares (st.Settings), from
// before the first heartbeat, and each new rule set's before it decides;
// and exports ratelimit_share_rules_differ.
func watchShareDigest(st Options, store *ruleset.Store, nodes *redisbackend.Nodes, reg prometheus.Registerer) {
	store.OnSwap(func(cfg *descriptors.Config) { nodes.SetShareDigest(st.Settings.ShareDigest(cfg)) })
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ratelimit_share_rules_differ",
		Help: "1 while the last heartbeat saw a live node whose rules hold other standing shares than this node's (a rollout of rules): no node holds a share until they agree; 0 otherwise.",
	}, func() float64 {
		if nodes.SharesDiffer() {
			return 1
		}
		return 0
	}))
}
