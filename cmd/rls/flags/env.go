package flags

import (
	"flag"
	"io"
	"sort"
	"strings"
)

// testEnvPrefix starts the RLS_* variables of sluice's own test suites
// (RLS_REQUIRE_REDIS), which are no flags.
const testEnvPrefix = "RLS_REQUIRE_"

// UnknownEnv returns a warning for each RLS_* variable of environ (KEY=value
// lines, as os.Environ) that no flag of rls serve or rls validate reads: a
// mistyped name would otherwise be ignored without a word. A warning names
// the closest flag variable when one is a typo away.
func UnknownEnv(environ []string) []string {
	known := map[string]bool{}
	var s Serve
	var v Validate
	for _, fs := range []*flag.FlagSet{newServeFlagSet(&s, io.Discard), newValidateFlagSet(&v, io.Discard)} {
		fs.VisitAll(func(f *flag.Flag) { known[EnvName(f.Name)] = true })
	}
	var warns []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, "RLS_") || known[name] || strings.HasPrefix(name, testEnvPrefix) {
			continue
		}
		w := name + " is set, but no flag reads it (the variable of --flag-name is RLS_FLAG_NAME)"
		if near := closest(name, known); near != "" {
			w = name + " is set, but no flag reads it: did you mean " + near + "?"
		}
		warns = append(warns, w)
	}
	sort.Strings(warns)
	return warns
}

// closest returns the name of known at most two edits away from name (the
// nearest, then the first in order), or "".
func closest(name string, known map[string]bool) string {
	best, bestDist := "", 3
	for k := range known {
		if d := editDistance(name, k); d < bestDist || d == bestDist && k < best {
			best, bestDist = k, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
