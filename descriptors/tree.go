package descriptors

import (
	"slices"
	"strings"
)

// node is one level of a domain's rule tree. Children are grouped by key;
// within a key, a request value is tried against exact values, then
// wildcard patterns in file order, then the key-only child.
type node struct {
	children map[string]*group
	rule     *Rule // nil when the descriptor has no rate_limit

	// For merging domains across files and for error messages.
	lvl  level
	file string
	pos  pos
}

type group struct {
	exact map[string]*node
	wild  []wildChild
	any   *node
}

type wildChild struct {
	pat  pattern
	node *node
}

// lookup returns the child of g that the rule descriptor with this level
// would occupy, or nil.
func (g *group) lookup(l level) *node {
	switch l.kind {
	case exact:
		return g.exact[l.value]
	case wildcard:
		for _, w := range g.wild {
			if w.pat.text == l.value {
				return w.node
			}
		}
		return nil
	default:
		return g.any
	}
}

func (g *group) add(l level, n *node) {
	switch l.kind {
	case exact:
		if g.exact == nil {
			g.exact = make(map[string]*node)
		}
		g.exact[l.value] = n
	case wildcard:
		g.wild = append(g.wild, wildChild{pat: compilePattern(l.value), node: n})
	default:
		g.any = n
	}
}

// levelOf returns the path element a descriptor defines.
func levelOf(d *Descriptor) level {
	l := level{key: d.Key, value: d.Value, valueToMetric: d.ValueToMetric, share: d.ShareThreshold}
	switch {
	case d.Value == "":
		l.kind = keyOnly
	case isPattern(d.Value):
		l.kind = wildcard
	default:
		l.kind = exact
	}
	return l
}

// builder assembles one domain from one or more files.
type builder struct {
	dom      *Domain
	errs     []*Error
	warns    []*Error
	replaces []replaceRef
}

type replaceRef struct {
	name string
	file string
	pos  pos
}

func (b *builder) addError(file string, p pos, format string, args ...any) {
	b.errs = append(b.errs, newError(file, p, format, args...))
}

// insert adds descriptors ds under n, whose path so far is path.
func (b *builder) insert(n *node, ds []Descriptor, path []level, file string) {
	for i := range ds {
		d := &ds[i]
		l := levelOf(d)
		if n.children == nil {
			n.children = make(map[string]*group)
		}
		g := n.children[d.Key]
		if g == nil {
			g = &group{}
			n.children[d.Key] = g
		}
		child := g.lookup(l)
		switch {
		case child == nil:
			if l.kind == wildcard {
				b.shadowed(g, d, file)
			}
			child = &node{lvl: l, file: file, pos: d.keyPos}
			g.add(l, child)
		case child.rule != nil && d.RateLimit != nil:
			b.addError(file, d.keyPos, "duplicate descriptor %s with a rate_limit (first at %s:%s)",
				describeNode(nodeID{d.Key, d.Value}), child.file, child.pos)
			continue
		case child.lvl != l:
			b.addError(file, d.keyPos, "descriptor %s disagrees on value_to_metric or share_threshold with %s:%s",
				describeNode(nodeID{d.Key, d.Value}), child.file, child.pos)
			continue
		}
		levels := append(slices.Clip(path), l)
		if d.RateLimit != nil {
			child.rule = b.rule(d, levels, file)
		}
		b.insert(child, d.Descriptors, levels, file)
	}
}

// shadowed warns when an earlier wildcard of g matches every value the
// wildcard value of d matches: the first matching wildcard in file order
// wins, so d's could never be chosen. Only an earlier pattern with one '*'
// is checked ("P*S" covers every pattern whose literal prefix starts with
// P and whose literal suffix ends with S); that is the common mistake, a
// catch-all before a narrower pattern.
func (b *builder) shadowed(g *group, d *Descriptor, file string) {
	p := compilePattern(d.Value)
	for _, w := range g.wild {
		e := &w.pat
		if len(e.middle) == 0 && strings.Count(e.text, "*") == 1 &&
			strings.HasPrefix(p.prefix, e.prefix) && strings.HasSuffix(p.suffix, e.suffix) {
			b.warns = append(b.warns, newError(file, d.valuePos,
				"wildcard value %q never matches: the earlier %q (%s:%s) matches every value it does, and the first matching wildcard in file order wins (as in envoyproxy/ratelimit); put the narrower pattern first",
				d.Value, e.text, w.node.file, w.node.pos))
			return
		}
	}
}

// rule builds the Rule of descriptor d at path levels.
func (b *builder) rule(d *Descriptor, levels []level, file string) *Rule {
	rl := d.RateLimit
	r := &Rule{
		Domain:         b.dom.Name,
		Name:           rl.Name,
		Unlimited:      rl.Unlimited,
		ShadowMode:     d.ShadowMode,
		QuotaMode:      d.QuotaMode,
		Postpaid:       d.Postpaid || d.QuotaMode,
		Protected:      d.Protected,
		Utilisation:    d.Utilisation,
		Metadata:       d.Metadata,
		DetailedMetric: d.DetailedMetric,
		levels:         levels,
		file:           file,
		pos:            d.keyPos,
	}
	path := make([]byte, 0, 64)
	path = append(path, b.dom.Name...)
	for _, l := range levels {
		path = append(path, '.')
		path = append(path, l.pathElem()...)
		r.dynamic = r.dynamic || l.showsValue(r.DetailedMetric)
	}
	r.Path = string(path)
	if knownConsistency(rl.Consistency) { // decode reports the others
		r.Consistency = rl.Consistency
	}
	if rl.Share != nil {
		r.Share, r.NoShare = *rl.Share, *rl.Share == 0
	}
	for _, rep := range rl.Replaces {
		r.Replaces = append(r.Replaces, rep.Name)
		b.replaces = append(b.replaces, replaceRef{rep.Name, file, rep.pos})
	}
	if !rl.Unlimited {
		if rl.Unit != 0 {
			var rpu uint32 // absent: 0, always over (as envoyproxy/ratelimit; validation warns)
			if rl.RequestsPerUnit != nil {
				rpu = *rl.RequestsPerUnit
			}
			r.GlobalRate = rateOf(rl.Unit, rpu, rl.UnitMultiplier, rl.Burst)
			lim := r.GlobalRate.Limit()
			r.Global = &lim
		}
		if l := rl.Local; l != nil && l.Unit != 0 && l.RequestsPerUnit != nil {
			r.LocalRate = rateOf(l.Unit, *l.RequestsPerUnit, l.UnitMultiplier, l.Burst)
			lim := r.LocalRate.Limit()
			r.Local = &lim
		}
	}
	b.dom.rules = append(b.dom.rules, r)
	return r
}

func rateOf(u Unit, rpu, mult uint32, burst *uint32) *Rate {
	r := &Rate{RequestsPerUnit: rpu, Unit: u, UnitMultiplier: max(mult, 1), Burst: rpu}
	if burst != nil {
		r.Burst = *burst
	}
	return r
}

// finish checks what needs the whole domain: replaces naming no rule
// (a warning), and two rules with one Path (an error when they collide
// level by level, else a warning).
func (b *builder) finish() {
	names := make(map[string]bool)
	paths := make(map[string]*Rule)
	for _, r := range b.dom.rules {
		if r.Name != "" {
			names[r.Name] = true
		}
		if first, dup := paths[r.Path]; dup {
			if !slices.EqualFunc(first.levels, r.levels, func(a, b level) bool { return a.pathElem() == b.pathElem() }) {
				// The '.' of a key or value shifts the levels ("a.b" beside
				// "a" → "b"): envoyproxy/ratelimit loads these, and no
				// request can reach the one through the other.
				b.warns = append(b.warns, newError(r.file, r.pos,
					"rule path %q is also the path of the rule at %s: metrics, /rlconfig and reload logs cannot tell them apart; rename a key or value", r.Path, first.Source()))
				continue
			}
			// The same key_value at one level: envoyproxy/ratelimit refuses
			// it too, and where it loads its lookup by key + "_" + value
			// lets a request reach a rule written for another key.
			b.addError(r.file, r.pos, "rule path %q is also the path of the rule at %s; rename a key or value", r.Path, first.Source())
			continue
		}
		paths[r.Path] = r
	}
	for _, ref := range b.replaces {
		if ref.name != "" && !names[ref.name] {
			// envoyproxy/ratelimit loads it; it replaces nothing.
			b.warns = append(b.warns, newError(ref.file, ref.pos,
				"replaces %q, but no rate_limit in domain %q has that name, so it replaces nothing (as in envoyproxy/ratelimit)", ref.name, b.dom.Name))
		}
	}
}
