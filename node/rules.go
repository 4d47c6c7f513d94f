package node

import (
	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/ruleset"
)

// Load loads the rule files at paths as one rule set, with the loading
// options r (--merge-domains, --max-rule-bytes, --gray-key): a node loads
// --config through it, rls validate its PATH arguments, so that validate
// accepts exactly what a node would load. No paths: the embedded example
// rules.
func (r Rules) Load(paths ...string) (*descriptors.Config, error) {
	return ruleset.LoadPaths(paths, r.descriptorOptions(), r.MaxRuleBytes)
}

// descriptorOptions are the rule-set options of r, for loads and reloads
// alike.
func (r Rules) descriptorOptions() descriptors.Options {
	return descriptors.Options{MergeDomains: r.MergeDomains, GrayKey: r.GrayKey}
}
