package adaptive

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rls/sluice/audit"
	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/override"
)

// Author is the author of the overrides the controller writes. Scale and
// limit overrides on a policy's scope by any other author are an
// operator's, and win.
const Author = "adaptive"

// DefaultExpiry is how long an override the controller writes lasts
// unless rewritten: the controller rewrites it when half of it is left,
// so a fleet whose actor is gone for good returns to its rule files'
// limits after at most this.
const DefaultExpiry = time.Hour

// Overrides is the part of override.Manager the controller uses.
type Overrides interface {
	// List returns the active overrides.
	List() []override.Override
	// Set stores o with author.
	Set(ctx context.Context, o override.Override, author string) (override.Override, error)
	// Remove deletes the override id.
	Remove(ctx context.Context, id, author, reason string) (override.Override, error)
}

// Options configures a Controller. Config, Source, Overrides and Rules
// are required.
type Options struct {
	Config    *Config
	Source    Source
	Overrides Overrides
	// Rules returns the current rule set: a policy scoped to a protected
	// rule never scales it above 1.
	Rules func() *descriptors.Config
	// Lock elects the actor (nil: Solo, this node acts).
	Lock  Lock
	Clock clockwork.Clock // nil: the real clock
	// Logger gets triggers, restores, changes and failures; nil discards.
	Logger *slog.Logger
	// Audit records triggers and restores (the overrides written are
	// recorded by Overrides); nil records nothing.
	Audit audit.Recorder
	// Node names this node in audit events.
	Node string
	// Registerer gets the ratelimit_adaptive_* metrics; nil: none.
	Registerer prometheus.Registerer
	// Expiry of the overrides written (default DefaultExpiry); at most
	// the Manager's limit on loosening overrides.
	Expiry time.Duration
}

// policyState is what the controller keeps of one policy.
type policyState struct {
	p       *Policy
	next    time.Time       // next evaluation
	st      State           // LastChange and LastGood; Scale in dry run only
	manual  string          // the operator's override standing the policy aside, "" none
	failing map[string]bool // signals whose last read gave no number
}

// Controller evaluates the policies while its node is the actor and writes
// their scale as scale overrides.
type Controller struct {
	opts    Options
	log     *slog.Logger
	m       *metrics
	mu      sync.Mutex // serializes Step
	actor   bool
	lockErr bool // the last Hold failed
	pols    []*policyState
}

// New returns a Controller; Run drives it.
func New(opts Options) *Controller {
	if opts.Clock == nil {
		opts.Clock = clockwork.NewRealClock()
	}
	if opts.Lock == nil {
		opts.Lock = Solo{}
	}
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	if opts.Expiry <= 0 {
		opts.Expiry = DefaultExpiry
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Controller{opts: opts, log: log, m: newMetrics(opts.Registerer)}
	if opts.Config.DryRun {
		c.m.dryRun.Set(1)
	}
	for i := range opts.Config.Policies {
		p := &opts.Config.Policies[i]
		c.pols = append(c.pols, &policyState{p: p, st: State{Scale: 1}, failing: make(map[string]bool)})
		c.m.scale.WithLabelValues(p.Name, p.Domain, p.Rule).Set(1)
		c.m.triggered.WithLabelValues(p.Name).Set(0)
		c.m.triggers.WithLabelValues(p.Name)
	}
	return c
}

// tick is how often Run steps: the shortest interval, and often enough
// to renew the lock three times within its TTL.
func (c *Controller) tick() time.Duration {
	d := c.opts.Config.LockTTL / 3
	for _, ps := range c.pols {
		d = min(d, ps.p.Interval)
	}
	return d
}

// Run steps every tick until ctx is done, then releases the lock.
func (c *Controller) Run(ctx context.Context) {
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		if err := c.opts.Lock.Release(rctx); err != nil {
			c.log.Warn("adaptive: releasing the actor lock failed; another node takes over when it expires", "err", err)
		}
	}()
	for {
		c.Step(ctx)
		t := c.opts.Clock.NewTimer(c.tick())
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.Chan():
		}
	}
}

// Step renews (or takes) the actor lock, updates the scale metrics from
// the overrides, and, on the actor, evaluates the policies that are due.
func (c *Controller) Step(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.opts.Clock.Now()
	lctx, cancel := context.WithTimeout(ctx, c.tick())
	held, err := c.opts.Lock.Hold(lctx)
	cancel()
	switch {
	case err != nil && !c.lockErr:
		c.log.Warn("adaptive: the actor lock is unreachable: not acting until it is back", "err", err)
	case err == nil && c.lockErr:
		c.log.Info("adaptive: the actor lock is reachable again")
	}
	c.lockErr = err != nil
	if held != c.actor {
		c.actor = held
		if held {
			c.log.Info("adaptive: this node is the actor: it evaluates the policies and writes their scale", "node", c.opts.Node)
			c.m.actor.Set(1)
		} else {
			c.log.Info("adaptive: this node is no longer the actor", "node", c.opts.Node)
			c.m.actor.Set(0)
		}
		list := c.opts.Overrides.List()
		for _, ps := range c.pols {
			// A new actor evaluates at once, waits a full StaleAfter before
			// giving up on a missing signal, and counts the cooldown from
			// the last change it can see: its own override's creation.
			ps.next, ps.st.LastGood, ps.st.LastChange = now, now, time.Time{}
			if own, _ := c.current(ps.p, list); own != nil {
				ps.st.LastChange = own.Created
			}
		}
	}
	list := c.opts.Overrides.List()
	for _, ps := range c.pols {
		if held && !now.Before(ps.next) {
			ps.next = now.Add(ps.p.Interval)
			c.evaluate(ctx, ps, list, now)
		}
	}
	list = c.opts.Overrides.List() // with what evaluate wrote
	for _, ps := range c.pols {
		scale := ps.st.Scale
		if !c.opts.Config.DryRun {
			own, _ := c.current(ps.p, list)
			scale = factor(own)
		}
		c.m.scale.WithLabelValues(ps.p.Name, ps.p.Domain, ps.p.Rule).Set(scale)
		c.m.triggered.WithLabelValues(ps.p.Name).Set(b2f(scale < 1))
	}
}

// evaluate reads p's signals, decides and applies the decision.
func (c *Controller) evaluate(ctx context.Context, ps *policyState, list []override.Override, now time.Time) {
	p, dry := ps.p, c.opts.Config.DryRun
	own, manual := c.current(p, list)
	if manual != nil {
		if ps.manual != manual.ID {
			c.log.Info("adaptive: an operator's override covers the policy's scope: it wins, the policy stands aside", "policy", p.Name, "override", manual.ID, "author", manual.Author)
			ps.manual = manual.ID
		}
		if own != nil && own.ID != manual.ID && !dry {
			_ = c.remove(ctx, ps, own, "operator override "+manual.ID+" wins") // logged
		}
		return
	}
	if ps.manual != "" {
		c.log.Info("adaptive: the operator's override is gone: the policy adapts again", "policy", p.Name, "override", ps.manual)
		ps.manual = ""
	}
	readings := c.read(ctx, ps)
	st := ps.st
	if !dry {
		st.Scale = factor(own)
	}
	d := p.Decide(st, readings, now, c.protected(p))
	if d.Good {
		ps.st.LastGood = now
	}
	if d.Scale == st.Scale {
		c.log.Debug("adaptive: holding", "policy", p.Name, "scale", st.Scale, "reason", d.Reason)
		if own != nil && !dry && own.Expires.Sub(now) < c.opts.Expiry/2 {
			_ = c.set(ctx, p, st.Scale, "refreshed: "+d.Reason, now) // logged; retried at the next evaluation
		}
		return
	}
	attrs := []any{"policy", p.Name, "scope", scope(p), "old", st.Scale, "new", d.Scale, "reason", d.Reason, "dry_run", dry}
	if dry {
		c.log.Info("adaptive: dry run: would change the scale", attrs...)
	} else {
		var err error
		if d.Scale == 1 {
			err = c.remove(ctx, ps, own, d.Reason)
		} else {
			err = c.set(ctx, p, d.Scale, d.Reason, now)
		}
		if err != nil {
			return
		}
	}
	ps.st.Scale, ps.st.LastChange = d.Scale, now
	kind := ""
	switch {
	case st.Scale >= 1 && d.Scale < 1:
		kind = audit.KindAdaptiveTrigger
		c.m.triggers.WithLabelValues(p.Name).Inc()
		c.log.Warn("adaptive: triggered: limits lowered", attrs...)
	case st.Scale < 1 && d.Scale >= 1:
		kind = audit.KindAdaptiveRestore
		c.log.Info("adaptive: restored: limits back to the rule files'", attrs...)
	default:
		c.log.Info("adaptive: scale changed", attrs...)
	}
	if kind != "" && !dry && c.opts.Audit != nil {
		c.opts.Audit.Record(ctx, audit.Event{Kind: kind, Time: now.UTC(), Node: c.opts.Node, Author: Author, Reason: d.Reason, Subject: p.Name,
			Changes: []audit.Change{{What: scope(p), Old: effect(st.Scale), New: effect(d.Scale)}}})
	}
}

// set writes p's scale override, expiring Expiry from now.
func (c *Controller) set(ctx context.Context, p *Policy, scale float64, reason string, now time.Time) error {
	o := override.Override{Domain: p.Domain, Rule: p.Rule, Kind: override.KindScale, Factor: scale,
		Reason: "adaptive policy " + p.Name + ": " + reason, Expires: now.Add(c.opts.Expiry)}
	if _, err := c.opts.Overrides.Set(ctx, o, Author); err != nil {
		c.log.Warn("adaptive: writing the scale override failed; retrying at the next evaluation", "policy", p.Name, "scale", scale, "err", err)
		return err
	}
	return nil
}

// remove deletes the policy's override own (nil: nothing to do).
func (c *Controller) remove(ctx context.Context, ps *policyState, own *override.Override, reason string) error {
	if own == nil {
		return nil
	}
	_, err := c.opts.Overrides.Remove(ctx, own.ID, Author, "adaptive policy "+ps.p.Name+": "+reason)
	if err != nil && !errors.Is(err, override.ErrNotFound) {
		c.log.Warn("adaptive: removing the scale override failed; retrying at the next evaluation", "policy", ps.p.Name, "err", err)
		return err
	}
	return nil
}

// read queries the policy's signals, each bounded by the query timeout
// (default: the interval), exports their values, and logs when one starts
// or stops giving a number.
func (c *Controller) read(ctx context.Context, ps *policyState) []Reading {
	p := ps.p
	type q struct{ name, query string }
	var qs []q
	for _, s := range p.Signals {
		qs = append(qs, q{s.Name, s.Query})
	}
	if p.Proportional != nil {
		qs = append(qs, q{"proportional", p.Proportional.Query})
	}
	timeout := c.opts.Config.QueryTimeout
	if timeout <= 0 {
		timeout = p.Interval
	}
	out := make([]Reading, len(qs))
	for i, q := range qs {
		qctx, cancel := context.WithTimeout(ctx, timeout)
		v, err := c.opts.Source.Query(qctx, q.query)
		cancel()
		out[i] = Reading{Name: q.name, Value: v, Err: err}
		ok := out[i].valid()
		switch {
		case !ok && !ps.failing[q.name]:
			c.log.Warn("adaptive: signal gives no number: holding the scale, back to 1 after stale_after", "policy", p.Name, "signal", out[i].String(), "stale_after", p.StaleAfter)
		case ok && ps.failing[q.name]:
			c.log.Info("adaptive: signal gives a number again", "policy", p.Name, "signal", out[i].String())
		}
		ps.failing[q.name] = !ok
		if !ok {
			c.m.signalErrors.WithLabelValues(p.Name, q.name).Inc()
			c.m.signal.WithLabelValues(p.Name, q.name).Set(math.NaN())
			continue
		}
		c.m.signal.WithLabelValues(p.Name, q.name).Set(v)
	}
	return out
}

// current finds, among the active overrides, the policy's own (written by
// the controller) and an operator's covering its scope, if any.
func (c *Controller) current(p *Policy, list []override.Override) (own, manual *override.Override) {
	id := override.NewID(override.Override{Domain: p.Domain, Rule: p.Rule, Kind: override.KindScale})
	for i := range list {
		o := &list[i]
		switch {
		case o.ID == id && o.Author == Author:
			own = o
		case o.Author != Author && covers(p, o):
			manual = o
		}
	}
	return own, manual
}

// covers reports whether an operator's override o sets the scale or limit
// of p's whole scope: a scale on everything, on p's domain or on p's rule,
// or a limit on p's rule.
func covers(p *Policy, o *override.Override) bool {
	if o.Value != "" || o.Domain != "" && o.Domain != p.Domain || o.Rule != "" && o.Rule != p.Rule {
		return false
	}
	return o.Kind == override.KindScale || o.Kind == override.KindLimit && p.Rule != ""
}

// protected reports whether p scales a protected rule.
func (c *Controller) protected(p *Policy) bool {
	if p.Rule == "" {
		return false // the override package keeps a domain's protected rules at ≤ 1
	}
	cfg := c.opts.Rules()
	if cfg == nil || cfg.Domain(p.Domain) == nil {
		return false
	}
	for _, r := range cfg.Domain(p.Domain).Rules() {
		if r.Path == p.Rule {
			return r.Protected
		}
	}
	return false
}

// factor is the scale an own override sets; 1 without one.
func factor(own *override.Override) float64 {
	if own == nil {
		return 1
	}
	return own.Factor
}

func scope(p *Policy) string {
	return override.Override{Domain: p.Domain, Rule: p.Rule}.Scope()
}

func effect(scale float64) string {
	return override.Override{Kind: override.KindScale, Factor: scale}.Effect()
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
