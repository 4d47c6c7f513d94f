// Package lint checks the GitHub Actions workflows with actionlint (syntax,
// expressions, action inputs, job graph, and shellcheck on run: scripts when
// shellcheck is installed). A module of its own: actionlint's dependencies
// stay out of rls.
package lint

import (
	"io"
	"path/filepath"
	"testing"

	"github.com/rhysd/actionlint"
)

func TestWorkflows(t *testing.T) {
	files, err := filepath.Glob("../workflows/*.yml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no workflows: %v", err)
	}
	l, err := actionlint.NewLinter(io.Discard, &actionlint.LinterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	errs, err := l.LintFiles(files, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range errs {
		t.Errorf("%s:%d:%d: %s [%s]", e.Filepath, e.Line, e.Column, e.Message, e.Kind)
	}
}

// TestLintFindsErrors: the linter run above does report a broken workflow.
func TestLintFindsErrors(t *testing.T) {
	l, err := actionlint.NewLinter(io.Discard, &actionlint.LinterOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bad := []byte("on: push\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    needs: missing\n    steps:\n      - run: echo ${{ github.nope }}\n")
	errs, err := l.Lint("bad.yml", bad, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) < 2 {
		t.Errorf("actionlint found %d errors in a workflow with an unknown job and an unknown context property, want 2: %v", len(errs), errs)
	}
}
