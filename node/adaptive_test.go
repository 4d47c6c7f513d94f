package node

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/override"
	"github.com/sluice-rls/sluice/ruleset"
)

// TestStartAdaptive: without --adaptive-config nothing runs; a file that
// does not parse stops the node's start with its problems; a valid one
// without Redis runs (Solo: this node acts) until stopped.
func TestStartAdaptive(t *testing.T) {
	cfg, err := descriptors.New(nil, descriptors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rules := ruleset.NewStore(cfg)
	store, _ := override.OpenFile("")
	mgr := override.NewManager(override.ManagerOptions{Store: store, Rules: rules.Rules})
	log := slog.New(slog.DiscardHandler)
	start := func(path string) (func(), *prometheus.Registry, error) {
		reg := prometheus.NewRegistry()
		st := Options{AdaptiveConfig: path, Overrides: Overrides{MaxExpiry: time.Hour}}
		cfg, err := loadAdaptive(st)
		if err != nil {
			return nil, reg, err
		}
		stop, err := startAdaptive(context.Background(), cfg, st, nil, mgr, rules, auditTrail{node: "n"}, log, reg)
		return stop, reg, err
	}
	stop, reg, err := start("")
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if mfs, _ := reg.Gather(); len(mfs) != 0 {
		t.Errorf("without --adaptive-config: %d metric families registered, want none", len(mfs))
	}

	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("prometheus: http://127.0.0.1:1\npolicies: [{name: a, domain: edge}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := start(bad); err == nil || !strings.Contains(err.Error(), "give signals") {
		t.Errorf("a policy without signals: %v, want the problem named", err)
	}

	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte("prometheus: http://127.0.0.1:1\npolicies: [{name: a, domain: edge, proportional: {query: up, baseline: 1}}]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	stop, reg, err = start(good)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	deadline := time.Now().Add(10 * time.Second)
	for actor := 0.0; actor != 1; {
		if time.Now().After(deadline) {
			t.Fatal("without Redis the node never acted (ratelimit_adaptive_actor != 1)")
		}
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == "ratelimit_adaptive_actor" {
				actor = mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		time.Sleep(10 * time.Millisecond) // polling the controller's goroutine
	}
}
