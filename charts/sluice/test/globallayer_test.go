package charttest

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// globalFlags are the flags globalLayer renders, by value key.
var globalFlags = map[string]string{"consistency": "--consistency", "share": "--share", "leasePeriod": "--lease-period"}

// parseGlobalFlags parses the global layer's flags in args as `rls serve`
// does: --share with strconv.ParseFloat (a Float64Var), --lease-period with
// time.ParseDuration (a DurationVar); --consistency as given (the schema's
// enum holds the modes).
func parseGlobalFlags(t *testing.T, args []string) (consistency string, share float64, period time.Duration) {
	t.Helper()
	consistency, _ = flag(args, "--consistency")
	var err error
	if v, ok := flag(args, "--share"); ok {
		if share, err = strconv.ParseFloat(v, 64); err != nil {
			t.Errorf("--share %q: %v", v, err)
		}
	}
	if v, ok := flag(args, "--lease-period"); ok {
		if period, err = time.ParseDuration(v); err != nil {
			t.Errorf("--lease-period %q: %v", v, err)
		}
	}
	return consistency, share, period
}

// serveFlagKinds returns the flags cmd/rls/flags registers, each with the
// FlagSet method that registers it (Float64Var, DurationVar, ...), read from
// its source: this module stays free of sluice's own dependencies.
func serveFlagKinds(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob("../../../cmd/rls/flags/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no cmd/rls/flags sources: %v", err)
	}
	out := map[string]string{}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) < 2 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			lit, isLit := call.Args[1].(*ast.BasicLit)
			if ok && isLit && lit.Kind == token.STRING && strings.HasSuffix(sel.Sel.Name, "Var") {
				if name, err := strconv.Unquote(lit.Value); err == nil {
					out["--"+name] = sel.Sel.Name
				}
			}
			return true
		})
	}
	return out
}

// TestGlobalFlagsAreServeFlags: the flags globalLayer renders are flags of
// `rls serve`, of the types parseGlobalFlags parses them as.
func TestGlobalFlagsAreServeFlags(t *testing.T) {
	kinds := serveFlagKinds(t)
	if kinds["--config"] != "StringVar" {
		t.Fatalf("cmd/rls/flags was not read (--config: %q)", kinds["--config"])
	}
	want := map[string]string{"--consistency": "TextVar", "--share": "Float64Var", "--lease-period": "DurationVar"}
	for _, name := range globalFlags {
		if kinds[name] == "" || kinds[name] != want[name] {
			t.Errorf("%s is registered by %q, want %q", name, kinds[name], want[name])
		}
	}
}

// TestGlobalLayerFlags: each globalLayer value set renders its flag, with a
// value sluice's flag types parse to what was given; an unset one renders
// none.
func TestGlobalLayerFlags(t *testing.T) {
	for _, tc := range []struct {
		vals        string
		want        map[string]string // flag -> rendered value
		consistency string
		share       float64
		period      time.Duration
	}{
		{"redis: {url: 'redis://r:6379/0'}", map[string]string{}, "", 0, 0},
		{"redis: {url: 'redis://r:6379/0'}\nglobalLayer: {consistency: leased}", map[string]string{"--consistency": "leased"}, "leased", 0, 0},
		{"redis: {bundled: {enabled: true}}\nglobalLayer: {consistency: exact, share: 0.5, leasePeriod: 2s}",
			map[string]string{"--consistency": "exact", "--share": "0.5", "--lease-period": "2s"}, "exact", 0.5, 2 * time.Second},
		{"redis: {existingSecret: {name: platform-redis}}\nglobalLayer: {share: '0.25'}", map[string]string{"--share": "0.25"}, "", 0.25, 0},
		{"redis: {url: 'redis://r:6379/0'}\nglobalLayer: {share: 0}", map[string]string{"--share": "0"}, "", 0, 0},
		{"redis: {url: 'redis://r:6379/0'}\nglobalLayer: {share: 0.00001}", map[string]string{"--share": "1e-05"}, "", 0.00001, 0},
		{"redis: {url: 'redis://r:6379/0'}\nglobalLayer: {leasePeriod: 1m30s}", map[string]string{"--lease-period": "1m30s"}, "", 0, 90 * time.Second},
	} {
		o := decodeAll(t, mustRender(t, "rules: {examples: true}\n"+tc.vals))
		checkCommon(t, o)
		_, c := o.sluice(t)
		for _, name := range globalFlags {
			got, ok := flag(c.Args, name)
			want, wantOK := tc.want[name]
			if ok != wantOK || got != want {
				t.Errorf("%s: %s %q (set %v), want %q (set %v)", tc.vals, name, got, ok, want, wantOK)
			}
		}
		if cons, share, period := parseGlobalFlags(t, c.Args); cons != tc.consistency || share != tc.share || period != tc.period {
			t.Errorf("%s: parsed %q %v %v, want %q %v %v", tc.vals, cons, share, period, tc.consistency, tc.share, tc.period)
		}
	}
}

// valuesSchema compiles values.schema.json with the JSON schema library
// Helm validates values with (as chartutil.ValidateAgainstSingleSchema does,
// without its network loaders), once for many instances.
func valuesSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	b, err := os.ReadFile("../values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("file:///values.schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("file:///values.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// strs returns every string of at most n symbols of alphabet.
func strs(alphabet []string, n int) []string {
	out, last := []string{""}, []string{""}
	for range n {
		var next []string
		for _, p := range last {
			for _, a := range alphabet {
				next = append(next, p+a)
			}
		}
		out, last = append(out, next...), next
	}
	return out
}

// TestSchemaAcceptsOnlyWhatSluiceTakes: every share and lease period the
// schema lets through is one `rls serve` parses and keeps (share 0 <= f < 1,
// a lease period above zero: sluice turns one of zero or less into the
// default), over every string of a few symbols; so a value sluice would
// refuse or ignore fails the install, not the pod. The values operators
// write pass.
func TestSchemaAcceptsOnlyWhatSluiceTakes(t *testing.T) {
	s := valuesSchema(t)
	accepts := func(key string, v any) bool {
		return s.Validate(map[string]any{"globalLayer": map[string]any{key: v}}) == nil
	}

	for _, v := range []string{"500ms", "1s", "2s", "1m30s", "1.5s", "0.001ms", "99999h99999h99999h99999h"} {
		if !accepts("leasePeriod", v) {
			t.Errorf("leasePeriod %q refused", v)
		}
	}
	n := 0
	for _, v := range strs([]string{"0", "1", ".", "-", "s", "m", "h", "n", "u"}, 5) {
		if v == "" || !accepts("leasePeriod", v) {
			continue
		}
		n++
		if d, err := time.ParseDuration(v); err != nil || d <= 0 {
			t.Errorf("leasePeriod %q passes the schema; sluice reads %v, %v", v, d, err)
		}
	}
	if n < 100 {
		t.Errorf("only %d lease periods of up to 5 symbols pass the schema", n)
	}

	for _, v := range []any{"0", "0.5", ".5", "0.999", 0, 0.5, 0.999999, 1e-9} {
		if !accepts("share", v) {
			t.Errorf("share %v refused", v)
		}
	}
	for _, f := range []float64{-1e-9, -0.1, 1, 1.5} {
		if accepts("share", f) {
			t.Errorf("share %v passes the schema", f)
		}
	}
	n = 0
	for _, v := range strs([]string{"0", "1", ".", "e", "-", "+", "x"}, 5) {
		if v == "" || !accepts("share", v) {
			continue
		}
		n++
		if f, err := strconv.ParseFloat(v, 64); err != nil || !(f >= 0 && f < 1) {
			t.Errorf("share %q passes the schema; sluice reads %v, %v", v, f, err)
		}
	}
	if n < 40 {
		t.Errorf("only %d shares of up to 5 symbols pass the schema", n)
	}
}
