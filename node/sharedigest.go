package node

import (
	"github.com/prometheus/client_golang/prometheus"

	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/ruleset"
)

// watchShareDigest keeps the share digest nodes publishes that of the
// rules in store as the standing shares resolve them (st.shareDigest), from
// before the first heartbeat, and each new rule set's before it decides;
// and exports ratelimit_share_rules_differ.
func watchShareDigest(st Options, store *ruleset.Store, nodes *redisbackend.Nodes, reg prometheus.Registerer) {
	store.OnSwap(func(cfg *descriptors.Config) { nodes.SetShareDigest(st.shareDigest(cfg)) })
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

// shareDigest is the digest of the standing shares cfg's rules hold on
// this node (descriptors.Config.ShareDigest with shareDefault): 0 under
// --quota-mode, where every hit is a charge and no rule holds one. Nodes
// that publish the same digest split every limit alike.
func (o *Options) shareDigest(cfg *descriptors.Config) uint64 {
	if o.QuotaMode {
		return 0
	}
	return cfg.ShareDigest(o.shareDefault())
}
