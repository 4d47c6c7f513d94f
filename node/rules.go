package node

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/ruleset"
	"github.com/sluice-rls/sluice/xds"
)

// ruleSource is where a running node's rules come from: the store the
// service reads, kept up to date from files (reloaded on change and on
// SIGHUP) or from an xDS management server.
type ruleSource struct {
	store   *ruleset.Store
	xds     *xds.Source // nil: rules from files
	initial int         // the rules the node started with, for the "serving" line
	stop    func()
}

// startRules loads the initial rules into a store and keeps it up to
// date until ctx is done: from --xds-server, or by reloading --config
// when it changes and on SIGHUP. stop ends what ctx does not.
func startRules(ctx context.Context, st Options, log *slog.Logger, reg prometheus.Registerer, trail auditTrail) (ruleSource, error) {
	if embeddedRules(st) {
		// README's first command; a deployment without --config is a mistake
		// (refused in Kubernetes unless --example-rules): say so loudly, and
		// in ratelimit_config_embedded.
		log.Warn("no --config: serving the embedded EXAMPLE rules, which limit traffic by rules written for the README, not for this deployment; give --config", "rules", ruleset.DefaultRulesName)
	}
	rules, err := initialRules(st)
	if err != nil {
		return ruleSource{}, fmt.Errorf("loading rules: %w", err)
	}
	ruleset.LogWarnings(log, rules)
	src := ruleSource{store: ruleset.NewStore(rules), initial: rules.Len()}
	reloadMetrics := ruleset.NewReloadMetrics(reg)
	stopXDS := func() {}
	// The watchers below end with ctx; stop cancels it and waits for them,
	// so that no goroutine of a node outlives its Run, early returns too.
	ctx, cancel := context.WithCancel(ctx)
	var watchers sync.WaitGroup
	if st.XDS.Server != "" {
		src.xds, stopXDS, err = startXDS(ctx, st, src.store, log, reg, reloadMetrics, trail)
		if err != nil {
			cancel()
			return ruleSource{}, err
		}
	} else {
		reloadMetrics.Loaded(true, time.Now())
	}
	reloader := &ruleset.Reloader{
		Path:     st.Config,
		Options:  st.Rules.descriptorOptions(),
		MaxBytes: st.MaxRuleBytes,
		Store:    src.store,
		Log:      log,
		Metrics:  reloadMetrics,
		Audit:    trail.rec,
		Node:     trail.node,
	}
	// Registered before serving, so an early SIGHUP reloads instead of
	// terminating the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	if src.xds == nil { // with xDS, SIGHUP does nothing
		watchers.Go(func() { reloadOn(ctx, hup, reloader) })
	}
	if st.Config != "" {
		watchers.Go(func() {
			if err := reloader.Watch(ctx); err != nil {
				log.Error("rule files are not watched; reload with SIGHUP", "err", err)
			}
		})
	}
	src.stop = func() {
		signal.Stop(hup)
		cancel()
		watchers.Wait()
		stopXDS()
	}
	return src, nil
}

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
