package adaptive

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"net/url"
	"os"
	"regexp"
	"time"

	"gopkg.in/yaml.v3"
)

// Defaults of a Policy's optional fields.
const (
	DefaultInterval    = 15 * time.Second
	DefaultLowerFactor = 0.8
	DefaultRaiseFactor = 1.1
	DefaultMinScale    = 0.1
	DefaultMaxScale    = 1.0
	// DefaultStaleIntervals: without a StaleAfter, a policy returns to 1
	// after this many intervals without a signal.
	DefaultStaleIntervals = 8
	// DefaultCooldownIntervals: without a Cooldown, a policy changes its
	// scale at most once per this many intervals.
	DefaultCooldownIntervals = 2
	// DefaultTolerance is the smallest change a proportional policy makes.
	DefaultTolerance = 0.05
	// DefaultLockTTL is how long the actor's lock lasts without renewal:
	// the longest a fleet goes without an actor when the actor dies.
	DefaultLockTTL = 10 * time.Second
)

// Bounds of what a file may ask for: larger values are typing mistakes.
const (
	maxPolicies = 256
	maxSignals  = 8
	maxQuery    = 4096
	maxFileSize = 1 << 20
	// MinInterval bounds how often a policy queries Prometheus.
	MinInterval = 100 * time.Millisecond
	// MaxScaleBound is the largest max_scale: the override package's MaxFactor.
	MaxScaleBound = 1000
)

// Config is an adaptive-limits file (--adaptive-config).
type Config struct {
	// Prometheus is the base URL of a Prometheus-compatible HTTP API
	// (Prometheus, Thanos, Mimir, VictoriaMetrics).
	Prometheus string `yaml:"prometheus"`
	// QueryTimeout bounds each query (default: the policy's interval).
	QueryTimeout time.Duration `yaml:"query_timeout"`
	// DryRun logs and exports what the policies would do, and writes no
	// override.
	DryRun bool `yaml:"dry_run"`
	// LockTTL is the actor lock's lifetime without renewal (default
	// DefaultLockTTL); the actor renews it every third of it.
	LockTTL time.Duration `yaml:"lock_ttl"`
	// Policies are evaluated each at its own interval.
	Policies []Policy `yaml:"policies"`
}

// Policy is one adaptive limit: the scope it scales, its signals, and how
// the scale follows them.
type Policy struct {
	// Name identifies the policy in metrics, logs and audit events.
	Name string `yaml:"name"`
	// Domain and Rule (a rule path as /rlconfig shows it; empty: every
	// rule of the domain) are the scope of the scale override written.
	Domain string `yaml:"domain"`
	Rule   string `yaml:"rule,omitempty"`
	// Signals are the step form: lower the scale (× LowerFactor) when any
	// signal is above its LowerAbove, raise it (× RaiseFactor) when every
	// signal is below its RaiseBelow, hold it in between.
	Signals []Signal `yaml:"signals,omitempty"`
	// Proportional is the other form: scale = value / Baseline.
	Proportional *Proportional `yaml:"proportional,omitempty"`
	LowerFactor  float64       `yaml:"lower_factor"`
	RaiseFactor  float64       `yaml:"raise_factor"`
	// MinScale and MaxScale bound the scale. MaxScale above 1 raises the
	// limits above the rule files' (never for a protected rule).
	MinScale float64 `yaml:"min_scale"`
	MaxScale float64 `yaml:"max_scale"`
	// Interval is how often the policy is evaluated.
	Interval time.Duration `yaml:"interval"`
	// Cooldown is the shortest time between two changes of the scale.
	Cooldown time.Duration `yaml:"cooldown"`
	// StaleAfter is how long the scale holds without a valid signal before
	// it returns to 1.
	StaleAfter time.Duration `yaml:"stale_after"`
}

// Signal is one PromQL query of the step form and its thresholds; the
// query must return one number (a scalar, or a vector of one sample).
type Signal struct {
	Name       string  `yaml:"name"`
	Query      string  `yaml:"query"`
	LowerAbove float64 `yaml:"lower_above"`
	RaiseBelow float64 `yaml:"raise_below"`
}

// Proportional is the proportional form: the scale is the query's value
// divided by Baseline (e.g. healthy instances / the instance count the
// rule file's limit was written for), bounded by MinScale and MaxScale,
// changed only by at least Tolerance.
type Proportional struct {
	Query     string  `yaml:"query"`
	Baseline  float64 `yaml:"baseline"`
	Tolerance float64 `yaml:"tolerance"`
}

// name is a policy's or signal's name: a Prometheus label value kept short
// and plain.
var name = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,64}$`)

// Load reads and checks an adaptive-limits file. A file read but wrong
// gives *Problems, with path; a file not read, its os error.
func Load(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("adaptive config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("adaptive config: %w", err)
	}
	if len(data) > maxFileSize {
		return nil, &Problems{Path: path, List: []Problem{{Msg: fmt.Sprintf("larger than %d bytes", maxFileSize)}}}
	}
	c, err := Parse(data)
	if ps := new(Problems); errors.As(err, &ps) {
		ps.Path = path
	}
	return c, err
}

// Parse decodes an adaptive-limits file (unknown fields are errors), fills
// in the defaults and checks it; every problem is returned at once, as
// *Problems, each with its line when it has one.
func Parse(data []byte) (*Config, error) {
	// Decoded twice: into a node tree for the lines of the values the
	// checks find at fault, and into Config (the tree's Decode has no
	// KnownFields).
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, &Problems{List: decodeProblems(err)}
	}
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return nil, &Problems{List: decodeProblems(err)}
	}
	if c.LockTTL == 0 {
		c.LockTTL = DefaultLockTTL
	}
	for i := range c.Policies {
		c.Policies[i].fill()
	}
	var root at
	if len(doc.Content) > 0 {
		root = at{doc.Content[0]}
	}
	if ps := c.check(root); len(ps) > 0 {
		return nil, &Problems{List: ps}
	}
	return &c, nil
}

// fill sets the defaults of p's unset fields.
func (p *Policy) fill() {
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&p.LowerFactor, DefaultLowerFactor)
	def(&p.RaiseFactor, DefaultRaiseFactor)
	def(&p.MinScale, DefaultMinScale)
	def(&p.MaxScale, DefaultMaxScale)
	if p.Interval == 0 {
		p.Interval = DefaultInterval
	}
	if p.Cooldown == 0 {
		p.Cooldown = DefaultCooldownIntervals * p.Interval
	}
	if p.StaleAfter == 0 {
		p.StaleAfter = DefaultStaleIntervals * p.Interval
	}
	if p.Proportional != nil {
		def(&p.Proportional.Tolerance, DefaultTolerance)
	}
}

// check returns c's problems, each at the line of its value in root.
func (c *Config) check(root at) []Problem {
	var ps []Problem
	bad := func(where at, field, format string, args ...any) {
		ps = append(ps, Problem{Line: where.line(field), Msg: fmt.Sprintf(format, args...)})
	}
	if u, err := url.Parse(c.Prometheus); c.Prometheus == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad(root, "prometheus", "prometheus: the http:// or https:// URL of a Prometheus-compatible API is required, not %q", redact(c.Prometheus))
	}
	if c.QueryTimeout < 0 {
		bad(root, "query_timeout", "query_timeout must not be negative")
	}
	if c.LockTTL < 3*MinInterval {
		bad(root, "lock_ttl", "lock_ttl must be at least %v, not %v", 3*MinInterval, c.LockTTL)
	}
	if len(c.Policies) > maxPolicies {
		bad(root, "policies", "%d policies: at most %d", len(c.Policies), maxPolicies)
	}
	seen := make(map[string]bool)
	scopes := make(map[[2]string]string)
	for i := range c.Policies {
		p, pn := &c.Policies[i], root.key("policies").index(i)
		if seen[p.Name] {
			bad(pn, "name", "policy %q: defined twice", p.Name)
		}
		seen[p.Name] = true
		if other, ok := scopes[[2]string{p.Domain, p.Rule}]; ok {
			bad(pn, "domain", "policy %q: scales the same scope as policy %q", p.Name, other)
		}
		scopes[[2]string{p.Domain, p.Rule}] = p.Name
		ps = append(ps, p.check(pn)...)
	}
	return ps
}

// check returns p's problems, each at the line of its value in pn.
func (p *Policy) check(pn at) []Problem {
	var ps []Problem
	bad := func(where at, field, format string, args ...any) {
		ps = append(ps, Problem{Line: where.line(field), Msg: fmt.Sprintf("policy %q: ", p.Name) + fmt.Sprintf(format, args...)})
	}
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	if !name.MatchString(p.Name) {
		bad(pn, "name", "name must be 1 to 64 letters, digits or _.:-")
	}
	if p.Domain == "" {
		bad(pn, "domain", "domain is required")
	}
	switch {
	case len(p.Signals) == 0 && p.Proportional == nil:
		bad(pn, "", "give signals (step form) or proportional")
	case len(p.Signals) > 0 && p.Proportional != nil:
		bad(pn, "proportional", "signals and proportional exclude each other")
	case len(p.Signals) > maxSignals:
		bad(pn, "signals", "%d signals: at most %d", len(p.Signals), maxSignals)
	}
	names := make(map[string]bool)
	for j, s := range p.Signals {
		sn := pn.key("signals").index(j)
		if !name.MatchString(s.Name) || names[s.Name] {
			bad(sn, "name", "signal name %q: want 1 to 64 letters, digits or _.:-, unique in the policy", s.Name)
		}
		names[s.Name] = true
		if s.Query == "" || len(s.Query) > maxQuery {
			bad(sn, "query", "signal %q: query must hold 1 to %d bytes", s.Name, maxQuery)
		}
		if !finite(s.LowerAbove) || !finite(s.RaiseBelow) || s.RaiseBelow >= s.LowerAbove {
			bad(sn, "raise_below", "signal %q: raise_below (%v) must be below lower_above (%v): the gap between them keeps the scale from flapping", s.Name, s.RaiseBelow, s.LowerAbove)
		}
	}
	if pr := p.Proportional; pr != nil {
		prn := pn.key("proportional")
		if pr.Query == "" || len(pr.Query) > maxQuery {
			bad(prn, "query", "proportional: query must hold 1 to %d bytes", maxQuery)
		}
		if !(pr.Baseline > 0) || !finite(pr.Baseline) {
			bad(prn, "baseline", "proportional: baseline must be above 0")
		}
		if !(pr.Tolerance > 0 && pr.Tolerance < 1) {
			bad(prn, "tolerance", "proportional: tolerance must be above 0 and below 1")
		}
	}
	if !(p.LowerFactor > 0 && p.LowerFactor < 1) {
		bad(pn, "lower_factor", "lower_factor must be above 0 and below 1, not %v", p.LowerFactor)
	}
	if !(p.RaiseFactor > 1 && p.RaiseFactor <= 10) {
		bad(pn, "raise_factor", "raise_factor must be above 1 and at most 10, not %v", p.RaiseFactor)
	}
	if !(p.MinScale > 0 && p.MinScale <= 1) {
		bad(pn, "min_scale", "min_scale must be above 0 and at most 1, not %v", p.MinScale)
	}
	if !(p.MaxScale >= 1 && p.MaxScale <= MaxScaleBound) {
		bad(pn, "max_scale", "max_scale must be at least 1 and at most %d, not %v", MaxScaleBound, p.MaxScale)
	}
	if p.Interval < MinInterval {
		bad(pn, "interval", "interval must be at least %v, not %v", MinInterval, p.Interval)
	}
	if p.Cooldown < 0 {
		bad(pn, "cooldown", "cooldown must not be negative")
	}
	if p.StaleAfter < p.Interval {
		bad(pn, "stale_after", "stale_after (%v) must be at least the interval (%v)", p.StaleAfter, p.Interval)
	}
	return ps
}

// redact hides the password of a URL's user information, for messages and
// logs; a string that is no URL is returned as is.
func redact(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	return s
}

// PrometheusRedacted is the Prometheus URL with its password hidden, for
// logs.
func (c *Config) PrometheusRedacted() string { return redact(c.Prometheus) }
