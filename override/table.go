package override

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/descriptors"
)

// Effect is what the overrides do to one matched request descriptor.
// Effects are compiled once per rule (and per overridden value) and shared
// by every request: never modify one.
type Effect struct {
	// Block refuses the descriptor: limit 0, whatever else applies.
	Block bool
	// Name is the current_limit name of a blocked descriptor:
	// "override <ID>" of the block.
	Name string
	// Allow bypasses the rule: OK, no tokens taken.
	Allow bool
	// Shadow answers OK whatever the rule decides.
	Shadow bool
	// Global and Local are the limits to enforce instead of the rule's;
	// nil keeps the rule's (or its absence).
	Global, Local *bucket.Limit
}

// BlockLimit is the limit a blocked descriptor is decided with: no token
// ever, so the local layer refuses it without asking the global one.
var BlockLimit = bucket.Limit{Requests: 0, Period: time.Second, Burst: 0}

// valueEffect is the effect on descriptors carrying key=value.
type valueEffect struct {
	key, value string
	eff        *Effect
}

// ruleEffects is what the table holds for one rule.
type ruleEffects struct {
	values []valueEffect // value-scoped, blocks first; tried before base
	base   *Effect       // nil: no override without a value
}

// Table is the compiled form of the active overrides against one rule set.
// It is immutable and safe for concurrent use; a nil *Table has no
// overrides.
type Table struct {
	cfg      *descriptors.Config
	rules    map[*descriptors.Rule]*ruleEffects
	unruled  map[string][]valueEffect // per domain: blocks for descriptors no rule matches
	active   []Override
	ignored  []string
	perKind  map[Kind]int
	earliest time.Time // the first expiry among active; zero: none
}

// Lookup returns the effect on a request descriptor of domain that matched
// rule (nil: none) with entries, or nil when no override applies. It costs
// a map lookup, plus a scan of the rule's value-scoped overrides when it
// has any.
func (t *Table) Lookup(domain string, rule *descriptors.Rule, entries []descriptors.Entry) *Effect {
	if t == nil {
		return nil
	}
	if rule == nil {
		return matchValues(t.unruled[domain], entries)
	}
	re := t.rules[rule]
	if re == nil {
		return nil
	}
	if e := matchValues(re.values, entries); e != nil {
		return e
	}
	return re.base
}

func matchValues(vs []valueEffect, entries []descriptors.Entry) *Effect {
	for i := range vs {
		for j := range entries {
			if entries[j].Key == vs[i].key && entries[j].Value == vs[i].value {
				return vs[i].eff
			}
		}
	}
	return nil
}

// Rules returns the rule set the table was compiled against.
func (t *Table) Rules() *descriptors.Config {
	if t == nil {
		return nil
	}
	return t.cfg
}

// Active returns the overrides the table was compiled from, sorted by ID.
// The slice is shared: do not modify it.
func (t *Table) Active() []Override {
	if t == nil {
		return nil
	}
	return t.active
}

// Ignored lists the overrides, or parts of them, a protected rule refused
// when the table was compiled ("override ID: rule P is protected: ...").
func (t *Table) Ignored() []string {
	if t == nil {
		return nil
	}
	return t.ignored
}

// Count returns the number of active overrides of kind k.
func (t *Table) Count(k Kind) int {
	if t == nil {
		return 0
	}
	return t.perKind[k]
}

// NextExpiry returns the earliest expiry among the active overrides; zero
// when none expires.
func (t *Table) NextExpiry() time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.earliest
}

// Compile builds the table of the overrides active at now against cfg.
// Overrides naming a domain or rule cfg does not have are kept (listed as
// active) but match nothing until a rule set has them. An override that
// would loosen a protected rule does not apply to it (Ignored says so).
// It returns nil when no override is active.
func Compile(cfg *descriptors.Config, all []Override, now time.Time) *Table {
	var active []Override
	for _, o := range all {
		if o.Active(now) && Validate(o, nil) == nil {
			active = append(active, o)
		}
	}
	if len(active) == 0 {
		return nil
	}
	slices.SortFunc(active, func(a, b Override) int { return cmp.Compare(a.ID, b.ID) })
	t := &Table{
		cfg:     cfg,
		rules:   make(map[*descriptors.Rule]*ruleEffects),
		unruled: make(map[string][]valueEffect),
		active:  active,
		perKind: make(map[Kind]int),
	}
	for _, o := range active {
		t.perKind[o.Kind]++
		if !o.Expires.IsZero() && (t.earliest.IsZero() || o.Expires.Before(t.earliest)) {
			t.earliest = o.Expires
		}
	}
	// Most specific first, blocks first among value-scoped ones.
	slices.SortStableFunc(active, func(a, b Override) int {
		return cmp.Or(cmp.Compare(specificity(b), specificity(a)), boolOrder(b.Kind == KindBlock, a.Kind == KindBlock))
	})
	for _, dn := range cfg.Domains() {
		dom := cfg.Domain(dn)
		for _, r := range dom.Rules() {
			t.compileRule(r, active)
		}
		for _, o := range active {
			if o.Kind == KindBlock && o.Domain == dn && o.Rule == "" {
				k, v, _ := parseValue(o.Value)
				t.unruled[dn] = append(t.unruled[dn], valueEffect{k, v, &Effect{Block: true, Name: "override " + o.ID}})
			}
		}
	}
	return t
}

// specificity orders scopes: a value beats a rule, a rule a domain, a
// domain everything.
func specificity(o Override) int {
	n := 0
	if o.Value != "" {
		n += 4
	}
	if o.Rule != "" {
		n += 2
	}
	if o.Domain != "" {
		n++
	}
	return n
}

func boolOrder(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// applies reports whether o's domain and rule scope covers r.
func applies(o Override, r *descriptors.Rule) bool {
	return (o.Domain == "" || o.Domain == r.Domain) && (o.Rule == "" || o.Rule == r.Path)
}

// compileRule adds r's effects: one without a value, one per overridden
// value (that value's overrides resolved together with the rule's).
func (t *Table) compileRule(r *descriptors.Rule, active []Override) {
	var base []Override
	var valued []Override
	for _, o := range active {
		if !applies(o, r) {
			continue
		}
		if why := loosens(o, r); why != "" {
			t.ignored = append(t.ignored, fmt.Sprintf("override %s: rule %s is protected: %s", o.ID, r.Path, why))
			continue
		}
		if o.Value == "" {
			base = append(base, o)
		} else {
			valued = append(valued, o)
		}
	}
	re := &ruleEffects{base: resolve(r, base)}
	for _, o := range valued {
		k, v, _ := parseValue(o.Value)
		if slices.ContainsFunc(re.values, func(ve valueEffect) bool { return ve.key == k && ve.value == v }) {
			continue // resolved with the first override of this value
		}
		var same []Override
		for _, p := range valued {
			if p.Value == o.Value {
				same = append(same, p)
			}
		}
		if e := resolve(r, append(same, base...)); e != nil {
			re.values = append(re.values, valueEffect{k, v, e})
		}
	}
	if re.base != nil || len(re.values) > 0 {
		t.rules[r] = re
	}
}

// resolve combines the overrides applying to r, most specific first: any
// block blocks; any allow bypasses; any shadow shadows; the most specific
// limit sets the limit, then the most specific scale multiplies it. Nil
// when they change nothing.
func resolve(r *descriptors.Rule, os []Override) *Effect {
	if len(os) == 0 {
		return nil
	}
	var e Effect
	var limit, scale *Override
	for i := range os {
		o := &os[i]
		switch o.Kind {
		case KindBlock:
			if !e.Block {
				e.Block, e.Name = true, "override "+o.ID
			}
		case KindAllow:
			e.Allow = true
		case KindShadow:
			e.Shadow = true
		case KindLimit:
			if limit == nil {
				limit = o
			}
		case KindScale:
			if scale == nil {
				scale = o
			}
		}
	}
	global, local := r.Global, r.Local
	if limit != nil && !r.Unlimited {
		l, _ := ParseLimit(limit.Limit, limit.Burst)
		if global != nil || local == nil {
			global = &l
		} else {
			local = &l
		}
	}
	if scale != nil {
		global, local = scaled(global, scale.Factor), scaled(local, scale.Factor)
	}
	if global != r.Global {
		e.Global = global
	}
	if local != r.Local {
		e.Local = local
	}
	if e == (Effect{}) {
		return nil
	}
	return &e
}

// scaled multiplies l's requests and burst by f, rounding to the nearest
// whole number and keeping at least 1 where there was at least 1, so a
// small factor tightens a limit without turning it into a block.
func scaled(l *bucket.Limit, f float64) *bucket.Limit {
	if l == nil {
		return nil
	}
	s := *l
	s.Requests, s.Burst = scaleN(l.Requests, f), scaleN(l.Burst, f)
	return &s
}

func scaleN(n uint64, f float64) uint64 {
	if n == 0 {
		return 0
	}
	v := math.Round(float64(n) * f)
	switch {
	case v < 1:
		return 1
	case v > math.MaxUint32:
		return math.MaxUint32
	}
	return uint64(v)
}
