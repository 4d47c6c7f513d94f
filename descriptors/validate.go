package descriptors

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-rls/sluice/bucket"
)

// Error is one problem in a rule file. Parse and New return every problem
// they find, joined with errors.Join; use errors.As to get at them.
type Error struct {
	File   string
	Line   int // 1-based; 0 when unknown
	Column int // 1-based; 0 when unknown (YAML syntax errors carry a line only)
	Reason string
}

// Error returns "file:line:column: reason", leaving out what is unknown.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(e.Line))
		if e.Column > 0 {
			b.WriteByte(':')
			b.WriteString(strconv.Itoa(e.Column))
		}
	}
	b.WriteString(": ")
	b.WriteString(e.Reason)
	return b.String()
}

// pos is a 1-based line and column in a rule file; zero when unknown.
type pos struct{ line, col int }

func (p pos) String() string { return fmt.Sprintf("%d:%d", p.line, p.col) }

// maxRefill bounds the time a bucket takes to refill completely
// (burst × period / requests). Longer refills are surely typos, and the
// bound keeps every duration the backends compute far from overflow.
const maxRefill = 100 * 365 * 24 * time.Hour

// maxErrors caps the problems reported for one load.
const maxErrors = 100

func newError(file string, p pos, format string, args ...any) *Error {
	return &Error{File: file, Line: p.line, Column: p.col, Reason: fmt.Sprintf(format, args...)}
}

// sortCapped sorts problems by position and keeps the first maxErrors,
// followed by one line counting the others.
func sortCapped(errs []*Error) []*Error {
	slices.SortStableFunc(errs, func(a, b *Error) int {
		return cmp.Or(cmp.Compare(a.File, b.File), cmp.Compare(a.Line, b.Line), cmp.Compare(a.Column, b.Column))
	})
	if len(errs) <= maxErrors {
		return errs
	}
	last := errs[len(errs)-1]
	return append(slices.Clip(errs[:maxErrors]), &Error{File: last.File, Reason: fmt.Sprintf("%d more problems not shown", len(errs)-maxErrors)})
}

// joinErrors sorts errs by position and joins them.
func joinErrors(errs []*Error) error {
	errs = sortCapped(errs)
	all := make([]error, len(errs))
	for i, e := range errs {
		all[i] = e
	}
	return errors.Join(all...)
}

// yamlError turns a yaml.v3 syntax error ("yaml: line 3: reason") into an
// *Error with that line. yaml.v3 does not report the column.
func yamlError(file string, err error) *Error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	e := &Error{File: file, Reason: "invalid YAML: " + msg}
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if n, tail, ok := strings.Cut(rest, ": "); ok {
			if line, err := strconv.Atoi(n); err == nil {
				e.Line, e.Reason = line, "invalid YAML: "+tail
			}
		}
	}
	return e
}

// validateFile checks what the decoder cannot see field by field: required
// fields, duplicates, and how the fields of a rate_limit combine. It
// returns the errors, and the warnings: what envoyproxy/ratelimit loads but
// sluice finds suspect (see Config.Warnings).
func validateFile(f *File) (errs, warns []*Error) {
	v := validator{file: f.Name}
	if f.Domain == "" && (f.domainOK || f.domainPos == pos{}) {
		v.add(f.domainPos, "domain is required and must not be empty")
	}
	v.descriptors(f.Descriptors)
	return v.errs, v.warns
}

type validator struct {
	file  string
	errs  []*Error
	warns []*Error
}

func (v *validator) add(p pos, format string, args ...any) {
	v.errs = append(v.errs, newError(v.file, p, format, args...))
}

func (v *validator) warn(p pos, format string, args ...any) {
	v.warns = append(v.warns, newError(v.file, p, format, args...))
}

// nodeID identifies a descriptor within its level: key plus value, where an
// empty value means key-only.
type nodeID struct{ key, value string }

func (v *validator) descriptors(ds []Descriptor) {
	seen := make(map[nodeID]pos, len(ds))
	for i := range ds {
		d := &ds[i]
		v.descriptor(d)
		id := nodeID{d.Key, d.Value}
		if first, dup := seen[id]; dup && d.Key != "" {
			v.add(d.keyPos, "duplicate descriptor %s (first at %s)", describeNode(id), first)
			continue
		}
		seen[id] = d.keyPos
	}
}

func describeNode(id nodeID) string {
	if id.value == "" {
		return fmt.Sprintf("key %q", id.key)
	}
	return fmt.Sprintf("key %q value %q", id.key, id.value)
}

func (v *validator) descriptor(d *Descriptor) {
	if d.Key == "" && (d.keyOK || d.keyPos == pos{}) {
		v.add(d.keyPos, "descriptor key is required and must not be empty")
	}
	if d.ShareThreshold && !strings.Contains(d.Value, "*") {
		v.add(d.sharePos, "share_threshold needs a wildcard value (one containing '*')")
	}
	if d.RateLimit != nil {
		v.rateLimit(d.RateLimit)
		v.share(d)
	}
	v.descriptors(d.Descriptors)
}

func (v *validator) rateLimit(r *RateLimit) {
	for _, rep := range r.Replaces {
		switch {
		case rep.Name == "":
			v.add(rep.pos, "replaces entry needs a non-empty name")
		case rep.Name == r.Name:
			v.add(rep.pos, "rate_limit %q must not replace itself", r.Name)
		}
	}
	if r.bad {
		return
	}
	if r.Unlimited {
		v.unlimited(r)
		return
	}
	hasGlobal := r.Unit != 0 || r.RequestsPerUnit != nil
	switch {
	case !hasGlobal && r.Local == nil:
		v.add(r.pos, "rate_limit needs unit and requests_per_unit, a local block, or unlimited: true")
	case !hasGlobal:
		if r.Burst != nil {
			v.add(r.burstPos, "burst needs unit and requests_per_unit (put a local-only burst in local)")
		}
		if r.UnitMultiplier != 0 {
			v.add(r.multPos, "unit_multiplier needs unit and requests_per_unit")
		}
	default:
		rpu := r.RequestsPerUnit
		if r.Unit != 0 && rpu == nil {
			// envoyproxy/ratelimit reads the missing number as 0.
			v.warn(r.unitPos, "rate_limit has a unit but no requests_per_unit: the limit is 0, so every request is over it (as in envoyproxy/ratelimit); write requests_per_unit: 0 to say so")
			rpu = new(uint32)
		}
		v.rate("rate_limit", r.pos, r.Unit, rpu, r.rpuPos, r.UnitMultiplier, r.multPos, r.Burst, r.burstPos)
	}
	if l := r.Local; l != nil && !l.bad {
		v.rate("local", l.pos, l.Unit, l.RequestsPerUnit, l.rpuPos, l.UnitMultiplier, l.multPos, l.Burst, l.burstPos)
	}
}

// share checks that a rate_limit with share has a global limit to share
// and is not charged into debt: a charge must land in the bucket every
// node sees (docs/decisions/0021-standing-shares.md).
func (v *validator) share(d *Descriptor) {
	r := d.RateLimit
	switch {
	case r.Share == nil || *r.Share == 0 || r.bad:
	case r.Unlimited || r.Unit == 0:
		v.add(r.sharePos, "share needs a global limit (unit and requests_per_unit)")
	case d.QuotaMode || d.Postpaid:
		v.add(r.sharePos, "share does not apply to postpaid or quota_mode rules: their charges must land in the bucket every node sees")
	}
}

func (v *validator) unlimited(r *RateLimit) {
	p := r.unlimitedPos
	if r.Unit != 0 {
		v.add(r.unitPos, "unlimited rate_limit must not have a unit")
	}
	if r.RequestsPerUnit != nil {
		v.warn(r.rpuPos, "requests_per_unit is ignored: the rate_limit is unlimited (as in envoyproxy/ratelimit); remove one of them")
	}
	if r.UnitMultiplier != 0 {
		v.add(r.multPos, "unlimited rate_limit must not have unit_multiplier")
	}
	if r.Burst != nil {
		v.add(r.burstPos, "unlimited rate_limit must not have burst")
	}
	if r.Local != nil {
		v.add(r.Local.pos, "unlimited rate_limit must not have a local block (unlimited at %s)", p)
	}
}

// rate checks one layer: unit and requests_per_unit both present, burst ≥ 1
// when requests_per_unit > 0, and period and refill time within bounds.
func (v *validator) rate(what string, at pos, u Unit, rpu *uint32, rpuPos pos, mult uint32, multPos pos, burst *uint32, burstPos pos) {
	if u == 0 && rpu == nil {
		v.add(at, "%s needs unit and requests_per_unit", what)
		return
	}
	if u == 0 {
		v.add(at, "%s has requests_per_unit but no unit", what)
		return
	}
	if rpu == nil {
		v.add(at, "%s has a unit but no requests_per_unit", what)
		return
	}
	period, ok := periodOf(u, mult)
	if !ok {
		v.add(multPos, "%s period %s is longer than 100 years", what, Rate{Unit: u, UnitMultiplier: mult}.periodString())
		return
	}
	b := *rpu
	if burst != nil {
		b = *burst
		if b < 1 && *rpu > 0 {
			v.add(burstPos, "%s burst must be at least 1 when requests_per_unit is above 0", what)
			return
		}
	}
	if *rpu > 0 {
		if _, ok := refillTime(uint64(b), period, uint64(*rpu)); !ok {
			p := rpuPos
			if burst != nil {
				p = burstPos
			}
			v.add(p, "%s takes more than 100 years to refill (burst %d × %s ÷ requests_per_unit %d)", what, b, Rate{Unit: u, UnitMultiplier: mult}.periodString(), *rpu)
		}
	}
}

// periodOf returns unit × multiplier (0 meaning 1), or false when that
// exceeds maxRefill.
func periodOf(u Unit, mult uint32) (time.Duration, bool) {
	if mult == 0 {
		mult = 1
	}
	d := u.Duration()
	if d <= 0 || uint64(mult) > uint64(maxRefill/d) {
		return 0, false
	}
	return d * time.Duration(mult), true
}

// refillTime returns burst × period ÷ requests, or false when it exceeds
// maxRefill (or requests is 0).
func refillTime(burst uint64, period time.Duration, requests uint64) (time.Duration, bool) {
	if requests == 0 || period < 0 {
		return 0, false
	}
	hi, lo := bits.Mul64(burst, uint64(period))
	if hi >= requests {
		return 0, false
	}
	q, _ := bits.Div64(hi, lo, requests)
	if q > uint64(maxRefill) || q > math.MaxInt64 {
		return 0, false
	}
	return time.Duration(q), true
}

// NewLimit returns the Limit of requests per unit × multiplier (0 meaning
// 1) with a burst of requests, as Envoy's per-descriptor limit override
// describes one. It holds the override to the bounds of rule files: an error
// when the period or the time to refill exceeds 100 years, which also keeps
// every duration the backends compute from overflowing.
func NewLimit(u Unit, requests, multiplier uint32) (bucket.Limit, error) {
	period, ok := periodOf(u, multiplier)
	if !ok {
		return bucket.Limit{}, fmt.Errorf("period %s is longer than 100 years", Rate{Unit: u, UnitMultiplier: multiplier}.periodString())
	}
	n := uint64(requests)
	if n > 0 {
		if _, ok := refillTime(n, period, n); !ok {
			return bucket.Limit{}, fmt.Errorf("%d/%s takes more than 100 years to refill", n, Rate{Unit: u, UnitMultiplier: multiplier}.periodString())
		}
	}
	return bucket.Limit{Requests: n, Period: period, Burst: n}, nil
}
