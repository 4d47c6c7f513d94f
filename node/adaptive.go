package node

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/adaptive"
	"github.com/sluice-rls/sluice/adaptive/redislock"
	"github.com/sluice-rls/sluice/override"
	"github.com/sluice-rls/sluice/ruleset"
)

// loadAdaptive reads and checks the file of --adaptive-config; nil
// without one. Run reads it before it starts anything, so that a bad file
// stops the node with nothing to wind down.
func loadAdaptive(st Options) (*adaptive.Config, error) {
	if st.AdaptiveConfig == "" {
		return nil, nil
	}
	cfg, err := adaptive.Load(st.AdaptiveConfig)
	if err != nil {
		return nil, fmt.Errorf("--adaptive-config: %w", err)
	}
	return cfg, nil
}

// startAdaptive runs the adaptive limits of cfg (from loadAdaptive; nil:
// none) until ctx is done; stop waits for the controller, which releases
// its lock. With Redis, the nodes elect one actor through a lock in it and
// the scale reaches every node through the shared overrides; without,
// each node adapts its own overrides (adaptive.Solo).
func startAdaptive(ctx context.Context, cfg *adaptive.Config, st Options, client goredis.UniversalClient, mgr *override.Manager, rules *ruleset.Store, trail auditTrail, log *slog.Logger, reg prometheus.Registerer) (stop func(), err error) {
	if cfg == nil {
		return func() {}, nil
	}
	src, err := adaptive.NewPrometheus(cfg.Prometheus, nil, cfg.QueryTimeout)
	if err != nil {
		return nil, err
	}
	var lock adaptive.Lock = adaptive.Solo{}
	if client != nil {
		lock = redislock.New(redislock.Options{Client: client, Holder: trail.node, TTL: cfg.LockTTL})
	}
	ctl := adaptive.New(adaptive.Options{
		Config:     cfg,
		Source:     src,
		Overrides:  mgr,
		Rules:      rules.Rules,
		Lock:       lock,
		Logger:     log,
		Audit:      trail.rec,
		Node:       trail.node,
		Registerer: reg,
		// A scale above 1 loosens: its override may not outlive
		// --override-max-expiry.
		Expiry: min(adaptive.DefaultExpiry, st.Overrides.MaxExpiry),
	})
	log.Info("adaptive limits on", "config", st.AdaptiveConfig, "policies", len(cfg.Policies), "prometheus", cfg.PrometheusRedacted(), "dry_run", cfg.DryRun, "shared", client != nil)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctl.Run(runCtx)
	}()
	return func() {
		cancel()
		<-done
	}, nil
}
