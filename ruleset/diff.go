package ruleset

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"unicode"

	"github.com/sluice-rls/sluice/audit"
	"github.com/sluice-rls/sluice/descriptors"
)

// Change is one difference between two rule sets.
type Change struct {
	Kind string // "added", "removed" or "changed"
	Rule string // domain-qualified path
	// Old and New are the rule's settings before and after, every field
	// that is set as "field=value" (see Fields); empty when absent.
	Old, New string
	// Fields lists, for a changed rule, every field that differs.
	Fields []FieldChange
}

// FieldChange is one field of a rule that differs between two rule sets:
// Field names it as in the rule file ("global.requests_per_unit",
// "share_threshold", "levels[1].value_to_metric"); Old and New are its
// values as text, empty when absent.
type FieldChange struct {
	Field, Old, New string
}

// String returns e.g. "global.unit: second → minute".
func (f FieldChange) String() string { return f.Field + ": " + f.Old + " → " + f.New }

// Diff lists the rules added, removed or changed from old to cur, by domain
// and path, comparing every field of the rules (see ruleFields).
func Diff(old, cur *descriptors.Config) []Change {
	out, _ := DiffListing(old, cur, -1)
	return out
}

// Counts sums up the changes from one rule set to another.
type Counts struct{ Added, Removed, Changed int }

// Total is the number of changes.
func (c Counts) Total() int { return c.Added + c.Removed + c.Changed }

// String returns e.g. "12 rules added, 0 removed, 3 changed".
func (c Counts) String() string {
	return fmt.Sprintf("%d rules added, %d removed, %d changed", c.Added, c.Removed, c.Changed)
}

// DiffListing is Diff listing only the first max changes (all when max
// is negative), in Diff's order, and counting them all: a change past max
// is not rendered, so that diffing a large update costs the listed
// changes, not its size in text.
func DiffListing(old, cur *descriptors.Config, max int) ([]Change, Counts) {
	var rn renderer
	var n Counts
	listing := func(out []Change) bool { return max < 0 || len(out) < max }
	type ruleID struct{ domain, path string }
	var before map[ruleID]*descriptors.Rule
	var order []*descriptors.Rule
	if old != nil {
		order = old.Rules()
		before = make(map[ruleID]*descriptors.Rule, len(order))
		for _, r := range order {
			before[ruleID{r.Domain, r.Path}] = r
		}
	}
	var out []Change
	seen := 0 // rules of old found in cur
	for _, r := range cur.Rules() {
		prev, ok := before[ruleID{r.Domain, r.Path}]
		switch {
		case !ok:
			n.Added++
			if listing(out) {
				out = append(out, Change{Kind: "added", Rule: r.Path, New: settings(rn.ruleFields(r))})
			}
		case rn.sameRule(prev, r):
			// Most rules of a reload: compared in place, nothing rendered.
		default:
			was, now := rn.ruleFields(prev), rn.ruleFields(r)
			if fc := diffFields(was, now); len(fc) > 0 {
				n.Changed++
				if listing(out) {
					out = append(out, Change{Kind: "changed", Rule: r.Path, Old: settings(was), New: settings(now), Fields: fc})
				}
			}
		}
		if ok {
			seen++
		}
	}
	if seen == len(order) {
		return out, n // nothing removed
	}
	inCur := make(map[ruleID]bool, len(cur.Rules()))
	for _, r := range cur.Rules() {
		inCur[ruleID{r.Domain, r.Path}] = true
	}
	for _, r := range order {
		if !inCur[ruleID{r.Domain, r.Path}] {
			n.Removed++
			if listing(out) {
				out = append(out, Change{Kind: "removed", Rule: r.Path, Old: settings(rn.ruleFields(r))})
			}
		}
	}
	return out, n
}

// LogChanges logs one line per change: "rule added", "rule removed" (with
// the rule's settings) or "rule changed" (with each field, old → new).
func LogChanges(log *slog.Logger, changes []Change) {
	for _, c := range changes {
		if c.Kind == "changed" {
			fields := make([]string, len(c.Fields))
			for i, f := range c.Fields {
				fields[i] = f.String()
			}
			log.Info("rule changed", "rule", c.Rule, "fields", strings.Join(fields, "; "))
			continue
		}
		log.Info("rule "+c.Kind, "rule", c.Rule, "old", c.Old, "new", c.New)
	}
}

// AuditChanges turns changes into the Changes of an audit.Event: one per
// changed field, named "<rule>: <field>", and one per rule added or
// removed, named "<rule>", with its settings as New or Old.
func AuditChanges(changes []Change) []audit.Change {
	var out []audit.Change
	for _, c := range changes {
		if c.Kind != "changed" {
			out = append(out, audit.Change{What: c.Rule, Old: c.Old, New: c.New})
			continue
		}
		for _, f := range c.Fields {
			out = append(out, audit.Change{What: c.Rule + ": " + f.Field, Old: f.Old, New: f.New})
		}
	}
	return out
}

// field is one rendered field of a rule.
type field struct{ name, value string }

// identityFields are the exported fields of descriptors.Rule that Diff does
// not compare: Domain and Path are a rule's identity (a rule whose path
// changed is removed and added), and Global and Local are computed from
// GlobalRate and LocalRate, which are compared field by field.
var identityFields = map[string]bool{"Domain": true, "Path": true, "Global": true, "Local": true}

// fieldNames renames the Go fields whose rule-file name is not their snake
// case.
var fieldNames = map[string]string{"GlobalRate": "global", "LocalRate": "local"}

// renderer renders rules for one Diff. It keeps, per struct type, the
// exported fields and their rule-file names, so that the reflection over a
// type and the names are worked out once per Diff, not once per rule.
type renderer struct {
	plans map[reflect.Type][]planField
}

// planField is one exported field of a struct type, as rendered.
type planField struct {
	index int
	name  string
}

// plan returns the exported fields of struct type t, skipping skip.
func (rn *renderer) plan(t reflect.Type, skip map[string]bool) []planField {
	if p, ok := rn.plans[t]; ok {
		return p
	}
	var p []planField
	for i := range t.NumField() {
		if sf := t.Field(i); sf.IsExported() && !skip[sf.Name] {
			p = append(p, planField{i, fieldName(sf.Name)})
		}
	}
	if rn.plans == nil {
		rn.plans = map[reflect.Type][]planField{}
	}
	rn.plans[t] = p
	return p
}

// ruleFields renders every field of r Diff compares, in a fixed order:
// each exported field of descriptors.Rule (but identityFields), found by
// reflection so that a field added to Rule is compared without a change
// here, and each field of every level (descriptors.Level). Pointers to
// structs are expanded field by field ("global.burst"); absent values
// (nil pointers, maps and slices) are left out.
func (rn *renderer) ruleFields(r *descriptors.Rule) []field {
	out := make([]field, 0, 16+4*r.Levels())
	rv := reflect.ValueOf(r).Elem()
	for _, f := range rn.plan(rv.Type(), identityFields) {
		out = rn.render(out, f.name, rv.Field(f.index))
	}
	for i := range r.Levels() {
		out = rn.render(out, "levels["+strconv.Itoa(i)+"]", reflect.ValueOf(r.Level(i)))
	}
	return out
}

// sameRule reports whether a and b have the same value in every field
// ruleFields renders, without rendering them. It may report a difference
// that renders the same (a nil and an empty map): Diff then renders both
// and finds no change.
func (rn *renderer) sameRule(a, b *descriptors.Rule) bool {
	if a.Levels() != b.Levels() {
		return false
	}
	for i := range a.Levels() {
		if a.Level(i) != b.Level(i) {
			return false
		}
	}
	av, bv := reflect.ValueOf(a).Elem(), reflect.ValueOf(b).Elem()
	for _, f := range rn.plan(av.Type(), identityFields) {
		if !rn.same(av.Field(f.index), bv.Field(f.index)) {
			return false
		}
	}
	return true
}

// same compares two values of one type as render sees them.
func (rn *renderer) same(a, b reflect.Value) bool {
	switch a.Kind() {
	case reflect.Pointer:
		if a.IsNil() || b.IsNil() {
			return a.IsNil() == b.IsNil()
		}
		return rn.same(a.Elem(), b.Elem())
	case reflect.Struct:
		for _, f := range rn.plan(a.Type(), nil) {
			if !rn.same(a.Field(f.index), b.Field(f.index)) {
				return false
			}
		}
		return true
	case reflect.Bool:
		return a.Bool() == b.Bool()
	case reflect.String:
		return a.String() == b.String()
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return a.Uint() == b.Uint()
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return a.Int() == b.Int()
	}
	return reflect.DeepEqual(a.Interface(), b.Interface())
}

// render appends v, named name, to out: a struct as one field per exported
// field, anything else as one canonical text.
func (rn *renderer) render(out []field, name string, v reflect.Value) []field {
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return out
		}
		v = v.Elem()
	}
	switch v.Kind() {
	case reflect.Struct:
		for _, f := range rn.plan(v.Type(), nil) {
			out = rn.render(out, name+"."+f.name, v.Field(f.index))
		}
		return out
	case reflect.Bool:
		return append(out, field{name, strconv.FormatBool(v.Bool())})
	case reflect.String:
		return append(out, field{name, v.String()})
	case reflect.Float32, reflect.Float64:
		if v.IsZero() {
			return append(out, field{name, ""}) // unset, as rate_limit.share: 0 cannot be written
		}
		return append(out, field{name, strconv.FormatFloat(v.Float(), 'g', -1, v.Type().Bits())})
	}
	if s, ok := v.Interface().(fmt.Stringer); ok {
		if v.IsZero() {
			// Unset, as an empty string: a rule without rate_limit.consistency
			// shows nothing, not "default".
			return append(out, field{name, ""})
		}
		return append(out, field{name, s.String()}) // a Unit: "second"
	}
	switch v.Kind() {
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return append(out, field{name, strconv.FormatUint(v.Uint(), 10)})
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return append(out, field{name, strconv.FormatInt(v.Int(), 10)})
	case reflect.Map, reflect.Slice:
		if v.Len() == 0 {
			return out
		}
		if v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.String {
			return append(out, field{name, strings.Join(v.Interface().([]string), " ")})
		}
		// encoding/json sorts map keys: one rendering per content.
		b, err := json.Marshal(v.Interface())
		if err != nil {
			return append(out, field{name, fmt.Sprint(v.Interface())})
		}
		return append(out, field{name, string(b)})
	}
	return append(out, field{name, fmt.Sprint(v.Interface())})
}

// fieldName is a Go field's name as in the rule file: RequestsPerUnit →
// requests_per_unit.
func fieldName(goName string) string {
	if n, ok := fieldNames[goName]; ok {
		return n
	}
	var b strings.Builder
	for i, c := range goName {
		if unicode.IsUpper(c) {
			if i > 0 {
				b.WriteByte('_')
			}
			c = unicode.ToLower(c)
		}
		b.WriteRune(c)
	}
	return b.String()
}

// diffFields lists the fields whose values differ between a and b; a field
// present in one only counts as "" in the other.
func diffFields(a, b []field) []FieldChange {
	if len(a) == len(b) {
		same := true // the same fields in the same order: compare in place
		var out []FieldChange
		for i := range a {
			if a[i].name != b[i].name {
				same = false
				break
			}
			if a[i].value != b[i].value {
				out = append(out, FieldChange{Field: a[i].name, Old: a[i].value, New: b[i].value})
			}
		}
		if same {
			return out
		}
	}
	old := make(map[string]string, len(a))
	for _, f := range a {
		old[f.name] = f.value
	}
	var out []FieldChange
	inB := make(map[string]bool, len(b))
	for _, f := range b {
		inB[f.name] = true
		if o := old[f.name]; o != f.value {
			out = append(out, FieldChange{Field: f.name, Old: o, New: f.value})
		}
	}
	for _, f := range a {
		if !inB[f.name] && f.value != "" {
			out = append(out, FieldChange{Field: f.name, Old: f.value})
		}
	}
	return out
}

// settings renders the fields that are set (not empty or false) as
// "field=value" separated by spaces; a value holding white space is
// quoted.
func settings(fs []field) string {
	var b strings.Builder
	for _, f := range fs {
		if f.value == "" || f.value == "false" {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(f.name)
		b.WriteByte('=')
		if strings.ContainsAny(f.value, " \t\n") {
			b.WriteString(strconv.Quote(f.value))
		} else {
			b.WriteString(f.value)
		}
	}
	return b.String()
}
