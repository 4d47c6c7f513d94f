package descriptors

import (
	"cmp"
	"slices"
)

// Options tunes New.
type Options struct {
	// MergeDomains lets several files define one domain; their trees are
	// merged. Descriptors with the same key and value at the same place
	// merge too, as long as at most one of them has a rate_limit and they
	// agree on value_to_metric and share_threshold. Without it a repeated
	// domain is an error (as envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG).
	MergeDomains bool
	// GrayKey is the descriptor key the service removes from requests
	// before matching (--gray-key); empty when the gray marker is off. A
	// rule level with this key can never match, so New warns about it.
	GrayKey string
	// LoaderWarnings are warnings the caller found outside the files'
	// content (ruleset: files of the rules directory it did not read),
	// reported by Config.Warnings with New's own.
	LoaderWarnings []*Error
}

// Config is an immutable, validated rule set: every domain of every file.
// It is safe for concurrent use; reload by building a new one.
type Config struct {
	domains map[string]*Domain
	names   []string
	rules   []*Rule
	warns   []*Error
}

// New builds the rule set from parsed files, in order. It validates each
// file again (so hand-built Files are checked too) and then what spans
// files: a domain defined twice is an error blaming the second file's
// domain line, unless opts.MergeDomains; replaces must name a rule of the
// domain; two rules of a domain must not share a Path. All problems are
// returned at once (errors.Join of *Error). Nil files are skipped.
//
// What envoyproxy/ratelimit loads but sluice finds suspect is loaded with
// the peer's meaning and reported as a warning instead (Config.Warnings).
func New(files []*File, opts Options) (*Config, error) {
	var errs []*Error
	warns := slices.Clone(opts.LoaderWarnings)
	builders := make(map[string]*builder)
	firstFile := make(map[string]*File)
	var order []*builder
	for _, f := range files {
		if f == nil {
			continue
		}
		fe, fw := validateFile(f)
		if len(fe) > 0 {
			errs = append(errs, fe...)
			continue
		}
		warns = append(warns, f.warns...)
		warns = append(warns, fw...)
		if opts.GrayKey != "" {
			warns = grayKeyWarnings(warns, f.Name, f.Descriptors, opts.GrayKey)
		}
		b := builders[f.Domain]
		if b != nil && !opts.MergeDomains {
			first := firstFile[f.Domain]
			errs = append(errs, newError(f.Name, f.domainPos, "duplicate domain %q (first defined in %s:%s); merging is off",
				f.Domain, first.Name, first.domainPos))
			continue
		}
		if b == nil {
			b = &builder{dom: &Domain{Name: f.Domain}}
			builders[f.Domain] = b
			firstFile[f.Domain] = f
			order = append(order, b)
		}
		b.insert(&b.dom.root, f.Descriptors, nil, f.Name)
	}
	c := &Config{domains: make(map[string]*Domain, len(order))}
	for _, b := range order {
		b.finish()
		errs = append(errs, b.errs...)
		warns = append(warns, b.warns...)
		slices.SortFunc(b.dom.rules, func(x, y *Rule) int { return cmp.Compare(x.Path, y.Path) })
		c.domains[b.dom.Name] = b.dom
		c.names = append(c.names, b.dom.Name)
		c.rules = append(c.rules, b.dom.rules...)
	}
	if len(errs) > 0 {
		return nil, WithWarnings(joinErrors(errs), warns)
	}
	c.warns = sortCapped(warns)
	slices.Sort(c.names)
	slices.SortFunc(c.rules, func(x, y *Rule) int {
		return cmp.Or(cmp.Compare(x.Path, y.Path), cmp.Compare(x.Domain, y.Domain))
	})
	return c, nil
}

// Warnings returns what the rule files do that envoyproxy/ratelimit
// accepts but sluice finds suspect, sorted by file and position, each
// "file:line:column: reason" (at most 100, then one line counting the
// rest). The rules were loaded with the peer's meaning: for example a unit
// without requests_per_unit is a limit of 0, a duplicate field's last
// value counts, a field in the wrong place is ignored. `rls serve` logs
// them at each load; `rls validate --strict` fails on them. The slice is
// shared: do not modify it.
func (c *Config) Warnings() []*Error {
	if c == nil {
		return nil
	}
	return c.warns
}

// grayKeyWarnings appends a warning for every descriptor of ds, at any
// depth, whose key is the gray key: the service removes such entries from
// requests before matching, so the level can never match.
func grayKeyWarnings(warns []*Error, file string, ds []Descriptor, gray string) []*Error {
	for i := range ds {
		d := &ds[i]
		if d.Key == gray {
			warns = append(warns, newError(file, d.keyPos,
				"descriptor key %q is the gray key: sluice removes %q entries from requests before matching, so this rule never matches; "+
					"give --gray-key another key, or --gray-key \"\" to turn the gray marker off", d.Key, gray))
		}
		warns = grayKeyWarnings(warns, file, d.Descriptors, gray)
	}
	return warns
}

// Domain returns the named domain, or nil when it is not configured.
// A nil *Config has no domains.
func (c *Config) Domain(name string) *Domain {
	if c == nil {
		return nil
	}
	return c.domains[name]
}

// Domains returns the configured domain names, sorted.
func (c *Config) Domains() []string {
	if c == nil {
		return nil
	}
	return c.names
}

// Rules returns every rule with a rate_limit, sorted by Path (then
// Domain), for /rlconfig and reload diffs. The slice is shared: do not
// modify it.
func (c *Config) Rules() []*Rule {
	if c == nil {
		return nil
	}
	return c.rules
}

// Len returns the number of rules with a rate_limit.
func (c *Config) Len() int {
	if c == nil {
		return 0
	}
	return len(c.rules)
}
