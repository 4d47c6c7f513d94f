package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/sluice-rls/sluice/cmd/rls/flags"
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
	cfg, err := v.Rules.Load(v.Paths...)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errors.New("invalid rule files")
	}
	warns := cfg.Warnings()
	for _, w := range warns {
		fmt.Fprintln(stderr, "warning:", w)
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
