package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/ruleset"
)

// validate checks rule files or directories, printing every problem as
// file:line:column: reason. Each argument is checked as one rule set.
func validate(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, "usage: rls validate PATH...\n")
		return errUsage
	}
	failed := false
	for _, path := range args {
		cfg, err := ruleset.Load(path, descriptors.Options{})
		if err != nil {
			failed = true
			fmt.Fprintln(stderr, err)
			continue
		}
		fmt.Fprintf(stdout, "%s: ok, %d rules\n", path, cfg.Len())
	}
	if failed {
		return errors.New("invalid rule files")
	}
	return nil
}
