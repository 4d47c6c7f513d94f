package flags_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/sluice-rls/sluice/cmd/rls/flags"
)

// TestUnknownEnv: a mistyped RLS_* variable is named, with the closest
// flag variable; the variables of flags, other variables and those of the
// test suites are not.
func TestUnknownEnv(t *testing.T) {
	got := flags.UnknownEnv([]string{
		"RLS_REDIS_TIMOUT=1s", "RLS_REDIS=redis://h:1", "RLS_STRICT=true", "RLS_WHATEVER_ELSE=1",
		"RLS_REQUIRE_REDIS=1", "REDIS_URL=x", "HOME=/root", "RLS_=",
	})
	want := []string{
		"RLS_ is set, but no flag reads it (the variable of --flag-name is RLS_FLAG_NAME)",
		"RLS_REDIS_TIMOUT is set, but no flag reads it: did you mean RLS_REDIS_TIMEOUT?",
		"RLS_WHATEVER_ELSE is set, but no flag reads it (the variable of --flag-name is RLS_FLAG_NAME)",
	}
	if !slices.Equal(got, want) {
		t.Errorf("UnknownEnv = %s\nwant %s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
