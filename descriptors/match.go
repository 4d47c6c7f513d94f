package descriptors

// Entry is one key/value pair of a request descriptor.
type Entry struct{ Key, Value string }

// Domain is the rule tree of one domain.
type Domain struct {
	// Name is the domain name.
	Name string

	root  node
	rules []*Rule
}

// Match returns the rule for one request descriptor, or nil when no rule
// applies. The caller has already removed gray entries. Match does not
// allocate and is safe for concurrent use.
//
// Matching is level-exact, as in envoyproxy/ratelimit: a descriptor of N
// entries matches only a rule N levels deep that has a rate_limit (an
// unlimited rule is a match). Entry i is looked up among the rule
// descriptors of level i with the same key, in this order (the peer's):
//
//  1. the exact value;
//  2. wildcard values ('*' matches any run of characters, '/' and the
//     empty run included), in file order: the first pattern that matches
//     wins, however many literal characters a later one has;
//  3. the key-only descriptor.
//
// The first that matches is taken and the walk goes on beneath it; it never
// backtracks to a less specific candidate when the chosen branch fails
// deeper down (envoyproxy/ratelimit does the same). So with rules
// "route=/a → user" and "route → ip", the request (route=/a, ip=x) matches
// nothing: write the ip rule under route=/a too.
func (d *Domain) Match(entries []Entry) *Rule {
	if d == nil || len(entries) == 0 {
		return nil
	}
	n := &d.root
	for i := range entries {
		e := &entries[i]
		g := n.children[e.Key]
		if g == nil {
			return nil
		}
		next := g.exact[e.Value]
		if next == nil {
			for j := range g.wild {
				if g.wild[j].pat.match(e.Value) {
					next = g.wild[j].node
					break
				}
			}
		}
		if next == nil {
			next = g.any
		}
		if next == nil {
			return nil
		}
		n = next
	}
	return n.rule
}

// Rules returns the domain's rules (those with a rate_limit), sorted by Path.
func (d *Domain) Rules() []*Rule { return d.rules }
