package ruleset_test

import (
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/sluice-rls/sluice/audit"
	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/ruleset"
)

// diffBase is the rule set every Diff case edits: rule d.k_v* sets every
// field of a rate_limit; EXTRA is where a case adds descriptor options.
const diffBase = `domain: d
descriptors:
  - key: other
    rate_limit: {name: other, unit: second, requests_per_unit: 1}
  - key: third
    rate_limit: {name: third, unit: second, requests_per_unit: 1}
  - key: k
    value: "v*"
    EXTRA
    rate_limit: {name: n, replaces: [{name: other}], unit: second, requests_per_unit: 10, burst: 20, local: {unit: second, requests_per_unit: 5, burst: 6}}
`

func mustConfig(t *testing.T, yaml string) *descriptors.Config {
	t.Helper()
	f, err := descriptors.Parse("rules.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("Parse:\n%s\n%v", yaml, err)
	}
	cfg, err := descriptors.New([]*descriptors.File{f}, descriptors.Options{})
	if err != nil {
		t.Fatalf("New:\n%s\n%v", yaml, err)
	}
	return cfg
}

// diffCases are named after the rule-file field each one changes, as
// yamlFields lists them: TestDiffCoversEveryRuleFileField fails when a
// field of descriptors.Descriptor (or of its rate_limit, local, replaces)
// has no case here.
var diffCases = []struct {
	field    string
	old, new string // replaced in diffBase; old "EXTRA" adds descriptor options
	want     []string
}{
	{"key", "key: k\n", "key: k2\n", []string{"+ d.k2_v*", "- d.k_v*"}},
	{"value", `value: "v*"`, `value: "w*"`, []string{"+ d.k_w*", "- d.k_v*"}},
	{"shadow_mode", "EXTRA", "shadow_mode: true", []string{"d.k_v*: shadow_mode: false → true"}},
	{"quota_mode", "EXTRA", "quota_mode: true", []string{"d.k_v*: quota_mode: false → true", "d.k_v*: postpaid: false → true"}}, // quota_mode implies postpaid
	{"postpaid", "EXTRA", "postpaid: true", []string{"d.k_v*: postpaid: false → true"}},
	{"metadata", "EXTRA", "metadata: {tier: gold, w: 2}", []string{`d.k_v*: metadata:  → {"tier":"gold","w":2}`}},
	{"detailed_metric", "EXTRA", "detailed_metric: true", []string{"d.k_v*: detailed_metric: false → true"}},
	{"protected", "EXTRA", "protected: true", []string{"d.k_v*: protected: false → true"}},
	{"utilisation", "EXTRA", "utilisation: true", []string{"d.k_v*: utilisation: false → true"}},
	{"value_to_metric", "EXTRA", "value_to_metric: true", []string{"d.k_v*: levels[0].value_to_metric: false → true"}},
	{"share_threshold", "EXTRA", "share_threshold: true", []string{"d.k_v*: levels[0].share_threshold: false → true"}},
	{"descriptors", "EXTRA", "descriptors: [{key: c, rate_limit: {unit: second, requests_per_unit: 1}}]", []string{"+ d.k_v*.c"}},
	{"rate_limit", "    rate_limit: {name: n,", "    descriptors: [{key: c, rate_limit: {unit: second, requests_per_unit: 1}}]\n    x: {name: n,", nil}, // rewritten below
	{"rate_limit.name", "name: n,", "name: m,", []string{"d.k_v*: name: n → m"}},
	{"rate_limit.consistency", "name: n,", "name: n, consistency: leased,", []string{"d.k_v*: consistency:  → leased"}},
	{"rate_limit.share", "name: n,", "name: n, share: 0.5,", []string{"d.k_v*: share:  → 0.5"}},
	{"rate_limit.replaces", "replaces: [{name: other}], ", "", []string{"d.k_v*: replaces: other → "}},
	{"rate_limit.replaces.name", "replaces: [{name: other}]", "replaces: [{name: third}]", []string{"d.k_v*: replaces: other → third"}},
	{"rate_limit.unlimited", "replaces: [{name: other}], unit: second, requests_per_unit: 10, burst: 20, local: {unit: second, requests_per_unit: 5, burst: 6}", "replaces: [{name: other}], unlimited: true", []string{
		"d.k_v*: unlimited: false → true",
		"d.k_v*: global.requests_per_unit: 10 → ", "d.k_v*: global.unit: second → ", "d.k_v*: global.unit_multiplier: 1 → ", "d.k_v*: global.burst: 20 → ",
		"d.k_v*: local.requests_per_unit: 5 → ", "d.k_v*: local.unit: second → ", "d.k_v*: local.unit_multiplier: 1 → ", "d.k_v*: local.burst: 6 → ",
	}},
	{"rate_limit.unit", "unit: second, requests_per_unit: 10", "unit: minute, requests_per_unit: 10", []string{"d.k_v*: global.unit: second → minute"}},
	{"rate_limit.requests_per_unit", "requests_per_unit: 10,", "requests_per_unit: 0,", []string{"d.k_v*: global.requests_per_unit: 10 → 0"}},
	{"rate_limit.unit_multiplier", "requests_per_unit: 10,", "requests_per_unit: 10, unit_multiplier: 3,", []string{"d.k_v*: global.unit_multiplier: 1 → 3"}},
	{"rate_limit.burst", "burst: 20", "burst: 21", []string{"d.k_v*: global.burst: 20 → 21"}},
	{"rate_limit.local", ", local: {unit: second, requests_per_unit: 5, burst: 6}", "", []string{
		"d.k_v*: local.requests_per_unit: 5 → ", "d.k_v*: local.unit: second → ", "d.k_v*: local.unit_multiplier: 1 → ", "d.k_v*: local.burst: 6 → ",
	}},
	{"rate_limit.local.unit", "local: {unit: second", "local: {unit: hour", []string{"d.k_v*: local.unit: second → hour"}},
	{"rate_limit.local.requests_per_unit", "requests_per_unit: 5,", "requests_per_unit: 7,", []string{"d.k_v*: local.requests_per_unit: 5 → 7"}},
	{"rate_limit.local.unit_multiplier", "requests_per_unit: 5,", "requests_per_unit: 5, unit_multiplier: 2,", []string{"d.k_v*: local.unit_multiplier: 1 → 2"}},
	{"rate_limit.local.burst", "burst: 6", "burst: 60", []string{"d.k_v*: local.burst: 6 → 60"}},
}

// render is one line per change: "+ rule", "- rule", or one per changed
// field, "rule: field: old → new".
func render(changes []ruleset.Change) []string {
	var out []string
	for _, c := range changes {
		switch c.Kind {
		case "added":
			out = append(out, "+ "+c.Rule)
		case "removed":
			out = append(out, "- "+c.Rule)
		default:
			for _, f := range c.Fields {
				out = append(out, c.Rule+": "+f.String())
			}
		}
	}
	return out
}

func TestDiffComparesEveryField(t *testing.T) {
	t.Parallel()
	base := strings.Replace(diffBase, "    EXTRA\n", "", 1)
	for _, tt := range diffCases {
		t.Run(tt.field, func(t *testing.T) {
			t.Parallel()
			src := diffBase
			if tt.old != "EXTRA" {
				src = strings.Replace(src, "    EXTRA\n", "", 1)
			}
			edited := strings.Replace(src, tt.old, tt.new, 1)
			want := tt.want
			if tt.field == "rate_limit" {
				// The descriptor keeps a child, loses its rate_limit: its
				// rule is removed, the child's added.
				edited = strings.Replace(base, "    rate_limit: {name: n, replaces: [{name: other}], unit: second, requests_per_unit: 10, burst: 20, local: {unit: second, requests_per_unit: 5, burst: 6}}\n",
					"    descriptors: [{key: c, rate_limit: {unit: second, requests_per_unit: 1}}]\n", 1)
				want = []string{"+ d.k_v*.c", "- d.k_v*"}
			}
			if edited == src && tt.old != "EXTRA" {
				t.Fatalf("case %s does not edit the base: %q not found", tt.field, tt.old)
			}
			got := render(ruleset.Diff(mustConfig(t, base), mustConfig(t, edited)))
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("Diff after editing %s (%q → %q): -want +got\n%s", tt.field, tt.old, tt.new, diff)
			}
			// And back: the same fields, old and new swapped.
			if back := ruleset.Diff(mustConfig(t, edited), mustConfig(t, base)); len(back) != len(ruleset.Diff(mustConfig(t, base), mustConfig(t, edited))) {
				t.Errorf("Diff back from the edit: %v, want as many changes as forth", render(back))
			}
		})
	}
}

// TestDiffCoversEveryRuleFileField fails when a field of the rule file
// (descriptors.Descriptor and what it holds) has no case in diffCases:
// add one, and Diff compares it if descriptors.Rule carries it.
func TestDiffCoversEveryRuleFileField(t *testing.T) {
	var cased []string
	for _, c := range diffCases {
		cased = append(cased, c.field)
	}
	for _, f := range yamlFields(reflect.TypeFor[descriptors.Descriptor](), "") {
		if !slices.Contains(cased, f) {
			t.Errorf("rule-file field %s has no case in diffCases: add one showing that Diff reports its change", f)
		}
	}
}

// yamlFields lists the yaml names of t's fields, dotted under prefix,
// descending into the structs they hold (but not into nested descriptors).
func yamlFields(t reflect.Type, prefix string) []string {
	var out []string
	for i := range t.NumField() {
		sf := t.Field(i)
		name, _, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		out = append(out, prefix+name)
		ft := sf.Type
		for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct && ft != reflect.TypeFor[descriptors.Descriptor]() {
			out = append(out, yamlFields(ft, prefix+name+".")...)
		}
	}
	return out
}

func TestDiffAddedAndRemovedCarrySettings(t *testing.T) {
	t.Parallel()
	empty := mustConfig(t, "domain: d\n")
	full := mustConfig(t, strings.Replace(diffBase, "EXTRA", "share_threshold: true\n    metadata: {tier: gold}", 1))
	got := ruleset.Diff(empty, full)
	var k ruleset.Change
	for _, c := range got {
		if c.Rule == "d.k_v*" {
			k = c
		}
	}
	want := `name=n replaces=other global.requests_per_unit=10 global.unit=second global.unit_multiplier=1 global.burst=20 local.requests_per_unit=5 local.unit=second local.unit_multiplier=1 local.burst=6 metadata={"tier":"gold"} levels[0].key=k levels[0].value=v* levels[0].share_threshold=true`
	if k.Kind != "added" || k.Old != "" || k.New != want {
		t.Errorf("added rule = %+v, want kind added, New %q", k, want)
	}
	back := ruleset.Diff(full, empty)
	found := false
	for _, c := range back {
		found = found || c.Kind == "removed" && c.Rule == "d.k_v*" && c.Old == want && c.New == ""
	}
	if len(back) != 3 || !found {
		t.Errorf("Diff back = %+v, want three removed rules, d.k_v* with Old %q", back, want)
	}
	if d := ruleset.Diff(nil, full); len(d) != 3 {
		t.Errorf("Diff from nil = %d changes, want 3 added", len(d))
	}
}

func TestAuditChanges(t *testing.T) {
	t.Parallel()
	got := ruleset.AuditChanges([]ruleset.Change{
		{Kind: "added", Rule: "d.a", New: "name=a"},
		{Kind: "changed", Rule: "d.b", Old: "x", New: "y", Fields: []ruleset.FieldChange{{"global.burst", "1", "2"}, {"shadow_mode", "false", "true"}}},
		{Kind: "removed", Rule: "d.c", Old: "name=c"},
	})
	want := []audit.Change{
		{What: "d.a", New: "name=a"},
		{What: "d.b: global.burst", Old: "1", New: "2"},
		{What: "d.b: shadow_mode", Old: "false", New: "true"},
		{What: "d.c", Old: "name=c"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("AuditChanges: -want +got\n%s", diff)
	}
}

// TestDiffSamePathOtherLevels: a rule's path is for humans ("a_b" is key
// a_b, or key a with value b); a change between the two keeps the path and
// is reported field by field, not missed.
func TestDiffSamePathOtherLevels(t *testing.T) {
	t.Parallel()
	keyOnly := mustConfig(t, "domain: d\ndescriptors:\n  - key: a_b\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	keyValue := mustConfig(t, "domain: d\ndescriptors:\n  - key: a\n    value: b\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	want := []string{"d.a_b: levels[0].key: a_b → a", "d.a_b: levels[0].value:  → b"}
	if diff := cmp.Diff(want, render(ruleset.Diff(keyOnly, keyValue))); diff != "" {
		t.Errorf("Diff: -want +got\n%s", diff)
	}
}

// BenchmarkDiff: a reload of 5000 rules, one of them changed.
func BenchmarkDiff(b *testing.B) {
	var before, after strings.Builder
	for _, sb := range []*strings.Builder{&before, &after} {
		sb.WriteString("domain: d\ndescriptors:\n")
	}
	for i := range 5000 {
		n := strconv.Itoa(i)
		line := "  - key: k" + n + "\n    metadata: {tier: gold}\n    rate_limit: {name: r" + n + ", unit: second, requests_per_unit: 10, local: {unit: second, requests_per_unit: 5}}\n"
		before.WriteString(line)
		if i == 7 {
			line = strings.Replace(line, "requests_per_unit: 10", "requests_per_unit: 11", 1)
		}
		after.WriteString(line)
	}
	f1, err := descriptors.Parse("a.yaml", []byte(before.String()))
	if err != nil {
		b.Fatal(err)
	}
	f2, err := descriptors.Parse("b.yaml", []byte(after.String()))
	if err != nil {
		b.Fatal(err)
	}
	old, err := descriptors.New([]*descriptors.File{f1}, descriptors.Options{})
	if err != nil {
		b.Fatal(err)
	}
	cur, err := descriptors.New([]*descriptors.File{f2}, descriptors.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if n := len(ruleset.Diff(old, cur)); n != 1 {
			b.Fatalf("%d changes, want 1", n)
		}
	}
}

// TestDiffListing: DiffListing lists Diff's first max changes, the same
// ones in the same order, and counts every change, each kind apart; a
// negative max lists them all.
func TestDiffListing(t *testing.T) {
	rules := func(from, to int, rpu string) string {
		var b strings.Builder
		b.WriteString("domain: d\ndescriptors:\n")
		for i := from; i < to; i++ {
			b.WriteString("  - key: k" + strconv.Itoa(i) + "\n    rate_limit: {unit: second, requests_per_unit: " + rpu + "}\n")
		}
		return b.String()
	}
	old := mustConfig(t, rules(0, 40, "1"))  // k0..k39
	mid := mustConfig(t, rules(10, 30, "2")) // k0..k9 and k30..k39 removed, k10..k29 changed
	cur := mustConfig(t, rules(10, 60, "2")) // k0..k9 removed, k10..k39 changed, k40..k59 added
	all := ruleset.Diff(old, cur)
	want := ruleset.Counts{Added: 20, Removed: 10, Changed: 30}
	for _, max := range []int{-1, 0, 1, 25, 69, 70, 71, 1000} {
		got, n := ruleset.DiffListing(old, cur, max)
		if n != want {
			t.Errorf("max %d: counts %+v, want %+v", max, n, want)
		}
		wantListed := all
		if max >= 0 && max < len(all) {
			wantListed = all[:max]
		}
		if diff := cmp.Diff(wantListed, got, cmpopts.EquateEmpty()); diff != "" {
			t.Errorf("max %d: listed changes differ from Diff's first ones:\n%s", max, diff)
		}
	}
	if _, n := ruleset.DiffListing(old, mid, 5); n != (ruleset.Counts{Removed: 20, Changed: 20}) || n.String() != "0 rules added, 20 removed, 20 changed" || n.Total() != 40 {
		t.Errorf("counts %+v (%s)", n, n)
	}
	if _, n := ruleset.DiffListing(nil, old, 0); n != (ruleset.Counts{Added: 40}) {
		t.Errorf("from nothing: counts %+v, want 40 added", n)
	}
	if got, n := ruleset.DiffListing(cur, cur, 10); len(got) != 0 || n.Total() != 0 {
		t.Errorf("no change: %v, %+v", got, n)
	}
}
