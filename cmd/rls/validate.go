package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sluice-rls/sluice/cmd/rls/flags"
	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/ruleset"
)

// validate checks rule files or directories as the one rule set serve
// would load from them, with serve's loading flags, printing every problem
// as file:line:column: reason, and every warning as "warning: " and the
// same. Warnings fail only with --strict.
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
		return fmt.Errorf("%w: rule files not read", errUsage)
	}
	if err != nil {
		return errors.New("invalid rule files")
	}
	if v.Strict && len(warns) > 0 {
		return fmt.Errorf("%d warnings (--strict)", len(warns))
	}
	fmt.Fprintf(stdout, "%s: ok, %d rules", strings.Join(v.Paths, ", "), cfg.Len())
	if len(warns) > 0 {
		fmt.Fprintf(stdout, ", %d warnings", len(warns))
	}
	fmt.Fprintln(stdout)
	return nil
}
