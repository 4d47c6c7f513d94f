package descriptors

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// Limits that keep a hostile rule file from exhausting memory or stack:
// aliases can make a small file describe a huge tree.
const (
	maxNodes = 1 << 20 // YAML nodes visited, aliases expanded
	maxDepth = 64      // nested descriptor levels
	maxMerge = 16      // merge keys inside merged mappings
)

// decoder walks a yaml.v3 node tree into the File model. It does by hand
// what yaml.v3's Decoder.KnownFields(true) does, because that reports a line
// but no column and stops describing a field at its Go type; here every
// unknown field, wrong type and out-of-range number is reported with its
// line and column, all at once.
type decoder struct {
	file      string
	budget    int
	exhausted bool
	merging   int // depth of merge-key expansion
	errs      []*Error
	warns     []*Error
	moreWarns int // warnings beyond maxErrors, counted, not kept
	// combined holds the mappings fields builds from a duplicated field
	// whose values are both mappings: their own repeated fields are the
	// file's one duplicate, already warned about.
	combined map[*yaml.Node]bool
}

var (
	rootFields       = []string{"domain", "descriptors"}
	descriptorFields = []string{"key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode", "metadata", "detailed_metric", "value_to_metric", "share_threshold", "protected", "postpaid", "utilisation"}
	rateLimitFields  = []string{"unit", "requests_per_unit", "unit_multiplier", "burst", "name", "replaces", "unlimited", "local", "consistency", "share"}
	localFields      = []string{"unit", "requests_per_unit", "unit_multiplier", "burst"}
	replaceFields    = []string{"name"}
)

// peerFields are the field names envoyproxy/ratelimit accepts anywhere in a
// file: it checks every mapping key against this one list, whatever the
// mapping, and its decoding ignores a name where its structs have no such
// field. sluice warns about such a field in the wrong place and ignores it
// too. quota_mode and metadata are descriptor fields of the peer.
var peerFields = []string{
	"domain", "key", "value", "descriptors", "rate_limit", "unit", "requests_per_unit",
	"unlimited", "shadow_mode", "quota_mode", "name", "replaces", "detailed_metric",
	"value_to_metric", "share_threshold", "metadata",
}

func at(n *yaml.Node) pos { return pos{n.Line, n.Column} }

func (d *decoder) errorf(n *yaml.Node, format string, args ...any) {
	d.errs = append(d.errs, newError(d.file, at(n), format, args...))
}

// warnf records a warning: something envoyproxy/ratelimit loads, loaded
// with its meaning, that sluice finds suspect. At most maxErrors are kept
// per file; the rest are counted (Parse adds one line saying how many).
func (d *decoder) warnf(n *yaml.Node, format string, args ...any) {
	if len(d.warns) >= maxErrors-1 { // one place left for the count
		d.moreWarns++
		return
	}
	d.warns = append(d.warns, newError(d.file, at(n), format, args...))
}

// resolve follows aliases and charges the node budget; nil means stop.
func (d *decoder) resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode; i++ {
		if i > 100 {
			d.errorf(n, "alias chain too long")
			return nil
		}
		n = n.Alias
	}
	if n == nil {
		return nil
	}
	d.budget--
	if d.budget < 0 {
		if !d.exhausted {
			d.exhausted = true
			d.errorf(n, "file too large or too many aliases (more than %d YAML nodes)", maxNodes)
		}
		return nil
	}
	return n
}

type field struct {
	name       string
	key, value *yaml.Node
}

// fields returns the fields of mapping n in order, after checking names
// against known and expanding merge keys ("<<: *anchor").
func (d *decoder) fields(n *yaml.Node, what string, known []string) []field {
	if n.Kind != yaml.MappingNode {
		d.errorf(n, "%s must be a mapping", what)
		return nil
	}
	var out []field
	seen := make(map[string]*yaml.Node)
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			merges = append(merges, v)
			continue
		}
		if k.Kind != yaml.ScalarNode {
			d.errorf(k, "field names in %s must be strings", what)
			continue
		}
		if !slices.Contains(known, k.Value) {
			if slices.Contains(peerFields, k.Value) {
				d.warnf(k, "%q is not a field of %s: ignored, as envoyproxy/ratelimit ignores a field it knows in the wrong place", k.Value, what)
				continue
			}
			d.errorf(k, "unknown field %q in %s (known: %s)", k.Value, what, strings.Join(known, ", "))
			continue
		}
		if first, dup := seen[k.Value]; dup {
			out = d.duplicate(n, out, field{k.Value, k, v}, first, what)
			continue
		}
		seen[k.Value] = k
		out = append(out, field{k.Value, k, v})
	}
	for _, m := range merges {
		out = d.merge(out, seen, m, what, known)
	}
	return out
}

// duplicate handles field f of mapping n, whose name an earlier field of
// out (key first) already has, as envoyproxy/ratelimit's YAML decoding
// (yaml.v2, not strict) does: the later value replaces the earlier one,
// except that two mappings (two rate_limit blocks, say) are combined, the
// later's fields replacing the earlier's of the same name. yaml.v3 would
// refuse the file; sluice loads it and warns.
func (d *decoder) duplicate(n *yaml.Node, out []field, f field, first *yaml.Node, what string) []field {
	i := slices.IndexFunc(out, func(o field) bool { return o.name == f.name })
	if i < 0 { // cannot happen: seen and out agree
		return append(out, f)
	}
	prev, cur := d.resolve(out[i].value), d.resolve(f.value)
	if prev == nil || cur == nil {
		return out
	}
	if prev.Kind == yaml.MappingNode && cur.Kind == yaml.MappingNode {
		if !d.combined[n] {
			d.warnf(f.key, "duplicate field %q in %s (first at %s): the two are combined, this one's fields winning, as envoyproxy/ratelimit does; write it once", f.name, what, at(first))
		}
		// A mapping built here grows in place, so that a field repeated n
		// times costs O(n), not O(n²).
		both := prev
		if !d.combined[prev] {
			both = &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: prev.Line, Column: prev.Column,
				Content: slices.Clone(prev.Content)}
			if d.combined == nil {
				d.combined = make(map[*yaml.Node]bool)
			}
			d.combined[both] = true
		}
		both.Content = append(both.Content, cur.Content...)
		out[i].value = both
		return out
	}
	if !d.combined[n] {
		d.warnf(f.key, "duplicate field %q in %s (first at %s): this one counts, as in envoyproxy/ratelimit; write it once", f.name, what, at(first))
	}
	out[i].key, out[i].value = f.key, cur
	return out
}

// merge adds the fields of the mapping(s) behind a merge key that are not
// set explicitly; as YAML specifies, earlier sources win.
func (d *decoder) merge(out []field, seen map[string]*yaml.Node, m *yaml.Node, what string, known []string) []field {
	m = d.resolve(m)
	if m == nil {
		return out
	}
	if d.merging >= maxMerge {
		d.errorf(m, "merge keys nested more than %d deep (does an anchor merge itself?)", maxMerge)
		return out
	}
	d.merging++
	defer func() { d.merging-- }()
	sources := []*yaml.Node{m}
	if m.Kind == yaml.SequenceNode {
		sources = m.Content
	}
	for _, s := range sources {
		s = d.resolve(s)
		if s == nil {
			continue
		}
		if s.Kind != yaml.MappingNode {
			d.errorf(s, "merge key in %s must refer to a mapping", what)
			continue
		}
		for _, f := range d.fields(s, what, known) {
			if _, set := seen[f.name]; set {
				continue
			}
			seen[f.name] = f.key
			out = append(out, f)
		}
	}
	return out
}

func (d *decoder) root(n *yaml.Node) *File {
	f := &File{domainPos: at(n), domainOK: true}
	n = d.resolve(n)
	if n == nil {
		return f
	}
	if n.Kind != yaml.MappingNode {
		d.errorf(n, "the file must be a mapping with domain and descriptors")
		f.domainOK = false
		return f
	}
	for _, fl := range d.fields(n, "the file", rootFields) {
		v := d.resolve(fl.value)
		if v == nil {
			continue
		}
		switch fl.name {
		case "domain":
			f.domainPos = at(v)
			f.Domain, f.domainOK = d.str(v, "domain")
		case "descriptors":
			f.Descriptors = d.descriptors(v, 1)
		}
	}
	return f
}

func (d *decoder) descriptors(n *yaml.Node, depth int) []Descriptor {
	if n.ShortTag() == "!!null" {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		d.errorf(n, "descriptors must be a list")
		return nil
	}
	if depth > maxDepth {
		d.errorf(n, "descriptors nested more than %d levels deep", maxDepth)
		return nil
	}
	var out []Descriptor
	for _, c := range n.Content {
		if c = d.resolve(c); c != nil {
			out = append(out, d.descriptor(c, depth))
		}
	}
	return out
}

func (d *decoder) descriptor(n *yaml.Node, depth int) Descriptor {
	desc := Descriptor{keyPos: at(n), keyOK: true}
	for _, fl := range d.fields(n, "a descriptor", descriptorFields) {
		v := d.resolve(fl.value)
		if v == nil {
			continue
		}
		switch fl.name {
		case "key":
			desc.keyPos = at(v)
			desc.Key, desc.keyOK = d.str(v, "key")
		case "value":
			desc.valuePos = at(v)
			desc.Value, _ = d.str(v, "value")
		case "rate_limit":
			desc.RateLimit = d.rateLimit(v)
		case "descriptors":
			desc.Descriptors = d.descriptors(v, depth+1)
		case "shadow_mode":
			desc.ShadowMode = d.boolean(v, fl.name)
		case "quota_mode":
			desc.QuotaMode = d.boolean(v, fl.name)
		case "postpaid":
			desc.Postpaid = d.boolean(v, fl.name)
		case "protected":
			desc.Protected = d.boolean(v, fl.name)
		case "utilisation":
			desc.Utilisation = d.boolean(v, fl.name)
		case "metadata":
			desc.Metadata = d.metadata(v)
		case "detailed_metric":
			desc.DetailedMetric = d.boolean(v, fl.name)
		case "value_to_metric":
			desc.ValueToMetric = d.boolean(v, fl.name)
		case "share_threshold":
			desc.sharePos = at(v)
			desc.ShareThreshold = d.boolean(v, fl.name)
		}
	}
	return desc
}

// metadata decodes a descriptor's metadata: a mapping of the values
// protobuf's Struct can hold, since it is sent as the response's
// dynamic_metadata. Null is no metadata.
func (d *decoder) metadata(n *yaml.Node) map[string]any {
	if n.ShortTag() == "!!null" {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		d.errorf(n, "metadata must be a mapping, got %s", describe(n))
		return nil
	}
	m, _ := d.metaValue(n, 1).(map[string]any)
	return m
}

// metaValue decodes one metadata value: a map[string]any, []any, string,
// bool, int64, float64 or nil. Integers outside int64 and non-finite
// numbers are errors: a Struct holds doubles, and JSON (the /json
// endpoint) cannot carry NaN or infinities.
func (d *decoder) metaValue(n *yaml.Node, depth int) any {
	if depth > maxDepth {
		d.errorf(n, "metadata nested more than %d levels deep", maxDepth)
		return nil
	}
	switch n.Kind {
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		seen := make(map[string]*yaml.Node, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := d.resolve(n.Content[i]), d.resolve(n.Content[i+1])
			if k == nil || v == nil {
				continue
			}
			switch {
			case k.Kind != yaml.ScalarNode:
				d.errorf(k, "metadata keys must be strings, got %s", describe(k))
				continue
			case k.ShortTag() == "!!merge":
				d.errorf(k, "merge keys (<<) are not supported in metadata")
				continue
			}
			if first, dup := seen[k.Value]; dup {
				// envoyproxy/ratelimit's yaml.v2 keeps the last.
				d.warnf(k, "duplicate key %q in metadata (first at %s): this one counts, as in envoyproxy/ratelimit; write it once", k.Value, at(first))
			}
			seen[k.Value] = k
			m[k.Value] = d.metaValue(v, depth+1)
		}
		return m
	case yaml.SequenceNode:
		l := make([]any, 0, len(n.Content))
		for _, c := range n.Content {
			if c = d.resolve(c); c != nil {
				l = append(l, d.metaValue(c, depth+1))
			}
		}
		return l
	}
	switch n.ShortTag() {
	case "!!null":
		return nil
	case "!!bool":
		return d.boolean(n, "a metadata value")
	case "!!int":
		var i int64
		if err := n.Decode(&i); err != nil {
			d.errorf(n, "metadata number %s is out of range", describe(n))
			return nil
		}
		return i
	case "!!float":
		var f float64
		if err := n.Decode(&f); err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			d.errorf(n, "metadata numbers must be finite, got %s", describe(n))
			return nil
		}
		return f
	}
	return n.Value // strings, and timestamps or binary as written
}

func (d *decoder) rateLimit(n *yaml.Node) *RateLimit {
	if n.ShortTag() == "!!null" {
		return nil
	}
	r := &RateLimit{pos: at(n)}
	before, inLocal := len(d.errs), 0
	var badUnit *yaml.Node
	defer func() {
		// envoyproxy/ratelimit checks the unit only of a limited rule.
		if badUnit != nil && r.Unlimited {
			d.warnf(badUnit, "unit %q is not a unit; ignored: the rate_limit is unlimited (as in envoyproxy/ratelimit); remove it", badUnit.Value)
		} else if badUnit != nil {
			d.unit(badUnit) // reports it
		}
		r.bad = len(d.errs)-before > inLocal
	}()
	for _, fl := range d.fields(n, "rate_limit", rateLimitFields) {
		v := d.resolve(fl.value)
		if v == nil {
			continue
		}
		switch fl.name {
		case "unit":
			r.unitPos = at(v)
			if _, ok := ParseUnit(v.Value); v.Kind == yaml.ScalarNode && !ok {
				badUnit = v // an error, unless the rule is unlimited: decided below
			} else {
				r.Unit = d.unit(v)
			}
		case "requests_per_unit":
			r.rpuPos = at(v)
			r.RequestsPerUnit = d.u32(v, fl.name)
		case "unit_multiplier":
			r.multPos = at(v)
			r.UnitMultiplier = d.multiplier(v)
		case "burst":
			r.burstPos = at(v)
			r.Burst = d.u32(v, fl.name)
		case "name":
			r.namePos = at(v)
			r.Name, _ = d.str(v, fl.name)
		case "replaces":
			r.Replaces = d.replaces(v)
		case "unlimited":
			r.unlimitedPos = at(v)
			r.Unlimited = d.boolean(v, fl.name)
		case "consistency":
			r.Consistency, _ = d.str(v, fl.name)
			if !knownConsistency(r.Consistency) {
				d.errorf(v, "consistency must be exact or leased, got %q", r.Consistency)
			}
		case "share":
			r.sharePos = at(v)
			r.Share = d.share(v)
		case "local":
			n := len(d.errs)
			r.Local = d.local(v)
			inLocal += len(d.errs) - n
		}
	}
	return r
}

func (d *decoder) local(n *yaml.Node) *LocalLimit {
	if n.ShortTag() == "!!null" {
		return nil
	}
	l := &LocalLimit{pos: at(n)}
	before := len(d.errs)
	defer func() { l.bad = len(d.errs) > before }()
	for _, fl := range d.fields(n, "local", localFields) {
		v := d.resolve(fl.value)
		if v == nil {
			continue
		}
		switch fl.name {
		case "unit":
			l.unitPos = at(v)
			l.Unit = d.unit(v)
		case "requests_per_unit":
			l.rpuPos = at(v)
			l.RequestsPerUnit = d.u32(v, fl.name)
		case "unit_multiplier":
			l.multPos = at(v)
			l.UnitMultiplier = d.multiplier(v)
		case "burst":
			l.burstPos = at(v)
			l.Burst = d.u32(v, fl.name)
		}
	}
	return l
}

func (d *decoder) replaces(n *yaml.Node) []Replace {
	if n.ShortTag() == "!!null" {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		d.errorf(n, "replaces must be a list of {name: ...}")
		return nil
	}
	var out []Replace
	for _, c := range n.Content {
		c = d.resolve(c)
		if c == nil {
			continue
		}
		rep := Replace{pos: at(c)}
		for _, fl := range d.fields(c, "a replaces entry", replaceFields) {
			if v := d.resolve(fl.value); v != nil {
				rep.pos = at(v)
				rep.Name, _ = d.str(v, "name")
			}
		}
		out = append(out, rep)
	}
	return out
}

// str accepts any scalar as a string (as written, so "007" stays "007");
// null is the empty string.
func (d *decoder) str(n *yaml.Node, what string) (string, bool) {
	if n.Kind != yaml.ScalarNode {
		d.errorf(n, "%s must be a string", what)
		return "", false
	}
	if n.ShortTag() == "!!null" {
		return "", true
	}
	return n.Value, true
}

func (d *decoder) boolean(n *yaml.Node, what string) bool {
	var b bool
	if n.Kind != yaml.ScalarNode || n.Decode(&b) != nil {
		d.errorf(n, "%s must be true or false, got %s", what, describe(n))
		return false
	}
	return b
}

func (d *decoder) unit(n *yaml.Node) Unit {
	s, ok := d.str(n, "unit")
	if !ok {
		return 0
	}
	u, ok := ParseUnit(s)
	if !ok {
		d.errorf(n, "unknown unit %q (want second, minute, hour, day, week, month or year)", s)
	}
	return u
}

// share decodes rate_limit.share: a number from 0 (no share) to below 1.
func (d *decoder) share(n *yaml.Node) *float64 {
	var f float64
	if n.Kind != yaml.ScalarNode || (n.ShortTag() != "!!float" && n.ShortTag() != "!!int") || n.Decode(&f) != nil || !(f >= 0 && f < 1) {
		d.errorf(n, "share must be a number from 0 to below 1 (the part of the global limit held by the nodes; 0: none, whatever --share says), got %s", describe(n))
		return nil
	}
	return &f
}

func (d *decoder) multiplier(n *yaml.Node) uint32 {
	m := d.u32(n, "unit_multiplier")
	if m == nil {
		return 0
	}
	if *m == 0 {
		d.errorf(n, "unit_multiplier must be at least 1")
	}
	return *m
}

// u32 decodes a whole number in [0, 2^32-1], the range of Envoy's uint32
// fields. On error it reports and returns nil.
func (d *decoder) u32(n *yaml.Node, what string) *uint32 {
	if n.Kind == yaml.ScalarNode {
		switch n.ShortTag() {
		case "!!int":
			var i int64
			if err := n.Decode(&i); err == nil {
				switch {
				case i < 0:
					d.errorf(n, "%s must not be negative, got %d", what, i)
				case i > math.MaxUint32:
					d.errorf(n, "%s is too large: %d (max %d)", what, i, uint32(math.MaxUint32))
				default:
					u := uint32(i)
					return &u
				}
				return nil
			}
			if strings.HasPrefix(n.Value, "-") {
				d.errorf(n, "%s must not be negative, got %s", what, n.Value)
			} else {
				d.errorf(n, "%s is too large: %s (max %d)", what, n.Value, uint32(math.MaxUint32))
			}
			return nil
		case "!!float":
			if isDigits(strings.TrimLeft(n.Value, "+-")) {
				if strings.HasPrefix(n.Value, "-") {
					d.errorf(n, "%s must not be negative, got %s", what, n.Value)
				} else {
					d.errorf(n, "%s is too large: %s (max %d)", what, n.Value, uint32(math.MaxUint32))
				}
				return nil
			}
		}
	}
	d.errorf(n, "%s must be a whole number, got %s", what, describe(n))
	return nil
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// describe names a node's value for an error message, briefly.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	v := n.Value
	if len(v) > 40 {
		v = v[:40] + "…"
	}
	return fmt.Sprintf("%q", v)
}
