package descriptors

import "strings"

// pattern is a wildcard value compiled at load: '*' matches any run of
// characters ('/' and the empty run included) and may appear anywhere, any
// number of times. There is no escape: a rule value containing '*' is
// always a pattern.
type pattern struct {
	text   string   // as written in the rule file
	prefix string   // literal before the first '*'
	suffix string   // literal after the last '*'
	middle []string // non-empty literals between stars, in order
}

// isPattern reports whether a rule value is a wildcard pattern.
func isPattern(value string) bool { return strings.Contains(value, "*") }

// compilePattern splits a value containing at least one '*'.
func compilePattern(s string) pattern {
	parts := strings.Split(s, "*")
	p := pattern{
		text:   s,
		prefix: parts[0],
		suffix: parts[len(parts)-1],
	}
	for _, m := range parts[1 : len(parts)-1] {
		if m != "" {
			p.middle = append(p.middle, m)
		}
	}
	return p
}

// match reports whether v matches the pattern. With the prefix and suffix
// anchored, taking each middle literal at its leftmost occurrence is
// optimal, so matching is linear-ish and never backtracks. It does not
// allocate.
func (p *pattern) match(v string) bool {
	if len(v) < len(p.prefix)+len(p.suffix) ||
		!strings.HasPrefix(v, p.prefix) || !strings.HasSuffix(v, p.suffix) {
		return false
	}
	rest := v[len(p.prefix) : len(v)-len(p.suffix)]
	for _, m := range p.middle {
		i := strings.Index(rest, m)
		if i < 0 {
			return false
		}
		rest = rest[i+len(m):]
	}
	return true
}
