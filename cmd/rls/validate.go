package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sluice-rls/sluice/adaptive"
	"github.com/sluice-rls/sluice/cmd/rls/flags"
	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/ruleset"
)

// errInvalid marks a failed check of the files validate read: exit 1.
var errInvalid = errors.New("invalid")

// validate checks rule files or directories as the one rule set serve
// would load from them, with serve's loading flags, printing every problem
// as file:line:column: reason, and every warning as "warning: " and the
// same; and the file of --adaptive-config, against those rules. Warnings
// fail only with --strict.
func validate(args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	v, err := flags.ParseValidate(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	for _, w := range flags.UnknownEnv(os.Environ()) {
		fmt.Fprintln(stderr, "rls validate: warning:", w)
	}
	var (
		oks   []string // what passed, one line each
		warns int
		errs  []error
		rules *descriptors.Config
	)
	if len(v.Paths) > 0 {
		cfg, n, err := validateRules(v, stderr)
		warns += n
		if err != nil {
			errs = append(errs, err)
		} else {
			rules = cfg
			oks = append(oks, okLine(strings.Join(v.Paths, ", "), cfg.Len(), "rules", n))
		}
	}
	if v.AdaptiveConfig != "" {
		c, n, err := validateAdaptive(v.AdaptiveConfig, rules, stderr)
		warns += n
		if err != nil {
			errs = append(errs, err)
		} else {
			oks = append(oks, okLine(v.AdaptiveConfig, len(c.Policies), "policies", n))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if v.Strict && warns > 0 {
		return fmt.Errorf("%d warnings (--strict)", warns)
	}
	for _, l := range oks {
		fmt.Fprintln(stdout, l)
	}
	return nil
}

// okLine is validate's line for what passed: "PATH: ok, N rules" and
// ", M warnings" when there are some.
func okLine(what string, n int, of string, warns int) string {
	l := fmt.Sprintf("%s: ok, %d %s", what, n, of)
	if warns > 0 {
		l += fmt.Sprintf(", %d warnings", warns)
	}
	return l
}

// validateRules loads v's rule paths as one set, printing its problems and
// warnings to stderr; it returns the set and its warning count.
func validateRules(v flags.Validate, stderr io.Writer) (*descriptors.Config, int, error) {
	cfg, err := v.Rules.Load(v.Paths...)
	warns := cfg.Warnings()
	if err != nil {
		fmt.Fprintln(stderr, err)
		warns = descriptors.WarningsOf(err)
	}
	for _, w := range warns {
		fmt.Fprintln(stderr, "warning:", w)
	}
	if err != nil && !errors.As(err, new(*descriptors.Error)) && !errors.Is(err, ruleset.ErrRulesTooLarge) {
		// No rule was read: a path that is missing, unreadable or no
		// regular file is the command line's error, as a usage error.
		return nil, len(warns), fmt.Errorf("%w: rule files not read", errUsage)
	}
	if err != nil {
		return nil, len(warns), fmt.Errorf("%w rule files", errInvalid)
	}
	return cfg, len(warns), nil
}

// validateAdaptive loads the adaptive-limits file at path as rls serve
// does, printing each problem to stderr as path:line: reason, and, when
// rules is not nil, warns of each policy whose scope it lacks or that
// would raise a protected rule. It returns the file and its warning count.
func validateAdaptive(path string, rules *descriptors.Config, stderr io.Writer) (*adaptive.Config, int, error) {
	c, err := adaptive.Load(path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		if errors.As(err, new(*adaptive.Problems)) {
			return nil, 0, fmt.Errorf("%w adaptive config", errInvalid)
		}
		return nil, 0, fmt.Errorf("%w: adaptive config not read", errUsage)
	}
	if rules == nil {
		return c, 0, nil
	}
	warns := 0
	warn := func(p *adaptive.Policy, format string, args ...any) {
		fmt.Fprintf(stderr, "warning: %s: policy %q: %s\n", path, p.Name, fmt.Sprintf(format, args...))
		warns++
	}
	for i := range c.Policies {
		p := &c.Policies[i]
		dom := rules.Domain(p.Domain)
		if dom == nil {
			warn(p, "the rules have no domain %q: the policy scales nothing", p.Domain)
			continue
		}
		if p.Rule == "" {
			continue
		}
		var rule *descriptors.Rule
		for _, r := range dom.Rules() {
			if r.Path == p.Rule {
				rule = r
			}
		}
		switch {
		case rule == nil:
			warn(p, "domain %q has no rule %q (rule paths as /rlconfig shows them): the policy scales nothing", p.Domain, p.Rule)
		case rule.Protected && p.MaxScale > 1:
			warn(p, "max_scale %v: rule %q is protected and is never scaled above 1", p.MaxScale, p.Rule)
		}
	}
	return c, warns, nil
}
