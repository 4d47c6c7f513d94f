package node

import (
	"context"
	"os"

	"github.com/prometheus/client_golang/prometheus"

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

// reloadOn reloads the rules on every signal from hup until ctx is done.
// Without --config (the embedded example rules) there is no file to read
// again: a signal is logged and changes nothing.
func reloadOn(ctx context.Context, hup <-chan os.Signal, r *ruleset.Reloader) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			if r.Path == "" {
				r.Log.Info("SIGHUP: no --config, so no rule file to reload; the embedded example rules stay")
				continue
			}
			r.Log.Info("SIGHUP: reloading rules")
			_ = r.Reload() // logged and counted by Reload
		}
	}
}

func ruleSource(path string) string {
	if path == "" {
		return ruleset.DefaultRulesName
	}
	return path
}

// embeddedRules reports whether serve runs the embedded example rules:
// neither --config nor --xds-server.
func embeddedRules(st Options) bool { return st.Config == "" && st.XDS.Server == "" }

// registerEmbeddedRules exports ratelimit_config_embedded: 1 while the
// embedded example rules are served (no --config), 0 otherwise.
func registerEmbeddedRules(reg prometheus.Registerer, embedded bool) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "ratelimit_config_embedded",
		Help: "1 while rls serve runs its embedded example rules because no --config was given, 0 otherwise.",
	})
	if embedded {
		g.Set(1)
	}
	reg.MustRegister(g)
}
