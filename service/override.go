package service

import (
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/override"
)

// OverrideSource hands out the runtime overrides compiled against a rule
// set (override.Manager). Table is called once per request with the rule
// set the request uses: it must cost about an atomic load, take no lock
// and make no network call; nil means no override.
type OverrideSource interface {
	Table(cfg *descriptors.Config) *override.Table
}

// overrides returns the table of runtime overrides for cfg; nil without
// an OverrideSource or without overrides.
func (s *Server) overrides(cfg *descriptors.Config) *override.Table {
	if s.opts.Overrides == nil {
		return nil
	}
	return s.opts.Overrides.Table(cfg)
}

// blockHit makes a descriptor a runtime override blocked refuse: a local
// hit on a limit of 0 (override.BlockLimit), which the local layer refuses
// without a bucket and before the global layer is asked.
func (s *Server) blockHit(sc *scratch, ds *descState, domain string, rule *descriptors.Rule, entries []descriptors.Entry, eff *override.Effect, cost uint64) {
	ds.name = eff.Name
	hit := bucket.Hit{Cost: cost, Limit: override.BlockLimit}
	// Keyed by its numbers, as an Envoy override is: a block never shares
	// (and so never converts) the rule's own local bucket.
	sc.keyBuf = descriptors.AppendKeyMaterial(sc.keyBuf[:0], domain, rule, descriptors.LocalBucket, entries, &hit.Limit)
	hit.Key = s.nodeKeys.Sum(sc.keyBuf)
	ds.local = len(sc.local)
	sc.local = append(sc.local, hit)
}

// ruleLimits returns the local and global limits of rule (nil: none) as
// the runtime override effect eff (nil: none) changes them.
func ruleLimits(rule *descriptors.Rule, eff *override.Effect) (local, global *bucket.Limit) {
	if rule == nil {
		return nil, nil
	}
	local, global = rule.Local, rule.Global
	if eff != nil {
		if eff.Local != nil {
			local = eff.Local
		}
		if eff.Global != nil {
			global = eff.Global
		}
	}
	return local, global
}
