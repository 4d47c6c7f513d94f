package flags_test

import (
	"flag"
	"io"
	"slices"
	"testing"

	"github.com/sluice-rls/sluice/cmd/rls/flags"
)

func TestParseInterspersed(t *testing.T) {
	for _, tt := range []struct {
		args       []string
		n          int
		reason     string
		positional []string
	}{
		{[]string{"a", "-n", "2", "b", "--reason", "x"}, 2, "x", []string{"a", "b"}},
		{[]string{"-n", "1", "a"}, 1, "", []string{"a"}},
		{[]string{"a", "--", "-n", "3", "b"}, 0, "", []string{"a", "-n", "3", "b"}},
		{[]string{"--reason", "r", "--", "--", "x"}, 0, "r", []string{"--", "x"}},
		{[]string{"-", "-n", "4"}, 4, "", []string{"-"}},
		{nil, 0, "", nil},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		n := fs.Int("n", 0, "")
		reason := fs.String("reason", "", "")
		if err := flags.ParseInterspersed(fs, tt.args); err != nil {
			t.Errorf("%q: %v", tt.args, err)
			continue
		}
		if *n != tt.n || *reason != tt.reason || !slices.Equal(fs.Args(), tt.positional) {
			t.Errorf("%q: n=%d reason=%q args=%q; want %d %q %q", tt.args, *n, *reason, fs.Args(), tt.n, tt.reason, tt.positional)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if err := flags.ParseInterspersed(fs, []string{"a", "--nope"}); err == nil {
		t.Error("an unknown flag after a positional argument was accepted")
	}
}
