package main

import (
	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/node"
	"github.com/sluice-rls/sluice/ruleset"
)

// loadRules loads the rule files at paths as one rule set, with the loading
// flags r (--merge-domains, --max-rule-bytes, --gray-key): serve loads --config through
// it, validate its PATH arguments, so that validate accepts exactly what
// serve would load. No paths: the embedded example rules.
func loadRules(r node.Rules, paths ...string) (*descriptors.Config, error) {
	return ruleset.LoadPaths(paths, ruleOptions(r), r.MaxRuleBytes)
}

// ruleOptions are the rule-set options of the loading flags r, for loads
// and reloads alike.
func ruleOptions(r node.Rules) descriptors.Options {
	return descriptors.Options{MergeDomains: r.MergeDomains, GrayKey: r.GrayKey}
}
