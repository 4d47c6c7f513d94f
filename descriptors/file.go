package descriptors

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"gopkg.in/yaml.v3"
)

// File is one parsed rule file: a domain and its descriptor tree, as written.
// Parse fills it from YAML; yaml.Marshal writes it back in the same format.
// Positions used in error messages are kept in unexported fields, so a File
// built by hand is valid input to New but its errors carry no positions.
type File struct {
	Name        string       `yaml:"-"` // file name used in error messages
	Domain      string       `yaml:"domain"`
	Descriptors []Descriptor `yaml:"descriptors,omitempty"`

	domainPos pos
	domainOK  bool     // false when the domain failed to decode (already reported)
	warns     []*Error // Parse's warnings, which New reports (Config.Warnings)
}

// Descriptor is one node of the rule tree: a key, an optional value (exact,
// or a pattern when it contains '*'), an optional rate limit, and nested
// descriptors for the next entry of a request descriptor.
type Descriptor struct {
	Key       string     `yaml:"key"`
	Value     string     `yaml:"value,omitempty"`
	RateLimit *RateLimit `yaml:"rate_limit,omitempty"`
	// ShadowMode makes the rule report OK whatever it decides.
	ShadowMode bool `yaml:"shadow_mode,omitempty"`
	// QuotaMode makes the rule a quota (envoyproxy/ratelimit's quota_mode):
	// its refusal alone does not refuse the request, which is refused when
	// a rule without quota_mode refuses it or every quota rule of the
	// request does. Its status still says OVER_LIMIT.
	QuotaMode bool `yaml:"quota_mode,omitempty"`
	// Postpaid makes the rule charge usage that already happened (a
	// post-charge, such as Envoy's apply_on_stream_done hits_addend): a
	// hit that does not fit is refused and still takes its tokens, into
	// debt, at most one burst deep, and the rule's checks and takes are
	// refused until the debt refilled. Its hits are decided on their own:
	// a refused one refuses the request, yet the request's other rules
	// keep their hits (bucket.Hit's Overdraw). quota_mode implies it.
	Postpaid bool `yaml:"postpaid,omitempty"`
	// Protected keeps runtime overrides from loosening the rule: it
	// cannot be bypassed, scaled above 1 or given a higher limit.
	Protected bool `yaml:"protected,omitempty"`
	// Utilisation makes the rule report, per tenant (the request value of
	// its last level), the tokens it takes against the rule's quota, for
	// quota reviews; the tenants a rule reports are capped (Rule.Tenant).
	Utilisation bool `yaml:"utilisation,omitempty"`
	// Metadata is sent back in the response's dynamic metadata (rls serve
	// --response-metadata) when the rule matched and did not refuse: a
	// mapping of JSON-like values (mappings with string keys, lists,
	// strings, numbers, booleans, null), as protobuf's Struct holds them.
	Metadata map[string]any `yaml:"metadata,omitempty"`
	// DetailedMetric puts every request value of the rule's levels in its
	// metric label.
	DetailedMetric bool `yaml:"detailed_metric,omitempty"`
	// ValueToMetric puts this level's request value in the metric label of
	// every rule at or below this node, except on a ShareThreshold level,
	// whose label keeps its wildcard pattern.
	ValueToMetric bool `yaml:"value_to_metric,omitempty"`
	// ShareThreshold makes every value matching this node's wildcard value
	// share one bucket and one metric label, the pattern.
	ShareThreshold bool         `yaml:"share_threshold,omitempty"`
	Descriptors    []Descriptor `yaml:"descriptors,omitempty"`

	keyPos, valuePos, sharePos pos
	keyOK                      bool // false when the key failed to decode
}

// RateLimit is a descriptor's rate_limit block. RequestsPerUnit and Burst
// are nil when absent (0 is a valid, always-refusing limit); UnitMultiplier
// is 0 when absent (meaning 1).
type RateLimit struct {
	Name            string      `yaml:"name,omitempty"`
	Replaces        []Replace   `yaml:"replaces,omitempty"`
	Unlimited       bool        `yaml:"unlimited,omitempty"`
	Unit            Unit        `yaml:"unit,omitempty"`
	RequestsPerUnit *uint32     `yaml:"requests_per_unit,omitempty"`
	UnitMultiplier  uint32      `yaml:"unit_multiplier,omitempty"`
	Burst           *uint32     `yaml:"burst,omitempty"`
	Local           *LocalLimit `yaml:"local,omitempty"`
	// Consistency is "exact", "leased" or empty (the server's
	// --consistency): how the global bucket is decided (Rule.Consistency).
	Consistency string `yaml:"consistency,omitempty"`
	// Share is the part f of the global limit held as standing shares,
	// split over the live nodes (Rule.Share); nil when absent (the
	// server's --share), else 0 ≤ f < 1, where 0 opts the rule out of
	// --share (Rule.NoShare).
	Share *float64 `yaml:"share,omitempty"`

	pos, namePos, unlimitedPos, unitPos, rpuPos, multPos, burstPos, sharePos pos
	bad                                                                      bool // a field failed to decode: skip combination checks
}

// Replace names a rule (by its rate_limit name) that this rule replaces
// when both match one request.
type Replace struct {
	Name string `yaml:"name"`

	pos pos
}

// LocalLimit is the per-node layer of a rate_limit (sluice extension).
type LocalLimit struct {
	Unit            Unit    `yaml:"unit,omitempty"`
	RequestsPerUnit *uint32 `yaml:"requests_per_unit,omitempty"`
	UnitMultiplier  uint32  `yaml:"unit_multiplier,omitempty"`
	Burst           *uint32 `yaml:"burst,omitempty"`

	pos, unitPos, rpuPos, multPos, burstPos pos
	bad                                     bool
}

// Parse strictly decodes and validates one rule file. Unknown fields,
// values of the wrong type and every rule problem are errors. All problems
// are reported at once, joined with errors.Join, each an *Error reading
// "file:line:column: reason" (sorted by position). filename is only used in
// messages.
//
// What envoyproxy/ratelimit's YAML decoding accepts is not an error but a
// warning, loaded with the peer's meaning: a field repeated in one mapping
// (the last counts; two mappings are combined), a field the peer knows in
// the wrong place (ignored), more YAML documents after the first (ignored).
// New reports these with its own warnings (Config.Warnings).
func Parse(filename string, data []byte) (*File, error) {
	root, more, err := decodeDocument(filename, data)
	if err != nil {
		return nil, err
	}
	d := decoder{file: filename, budget: maxNodes}
	if more != nil {
		d.warns = append(d.warns, more)
	}
	f := d.root(root)
	f.Name = filename
	if !d.exhausted {
		errs, warns := validateFile(f) // New validates again and reports the warnings
		d.errs = append(d.errs, errs...)
		if len(d.errs) > 0 {
			d.warns = append(d.warns, warns...)
		}
	}
	if len(d.errs) > 0 {
		return nil, WithWarnings(joinErrors(d.errs), d.warns)
	}
	if d.moreWarns > 0 {
		d.warns = append(d.warns, &Error{File: filename, Reason: fmt.Sprintf("%d more warnings not shown", d.moreWarns)})
	}
	f.warns = d.warns
	return f, nil
}

// decodeDocument reads the first YAML document into a node tree. When
// more follow, more is the warning saying they are ignored, as
// envoyproxy/ratelimit's yaml.Unmarshal ignores them.
func decodeDocument(filename string, data []byte) (root *yaml.Node, more *Error, err error) {
	// yaml.v3 is not ours: turn a panic on hostile input into an error.
	defer func() {
		if r := recover(); r != nil {
			root, more, err = nil, nil, &Error{File: filename, Reason: fmt.Sprintf("invalid YAML: %v", r)}
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil, &Error{File: filename, Line: 1, Column: 1, Reason: "empty file: domain is required"}
		}
		return nil, nil, yamlError(filename, err)
	}
	const ignored = "more than one YAML document in the file: only the first is loaded, as envoyproxy/ratelimit does"
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case err == nil:
		more = &Error{File: filename, Line: next.Line, Column: next.Column, Reason: ignored}
	case !errors.Is(err, io.EOF):
		// A later document that does not even parse: still ignored.
		more = yamlError(filename, err)
		more.Reason = ignored + " (the next one is " + more.Reason + ")"
	}
	if len(doc.Content) == 0 {
		return nil, nil, &Error{File: filename, Line: 1, Column: 1, Reason: "empty file: domain is required"}
	}
	return doc.Content[0], more, nil
}
