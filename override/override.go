package override

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/descriptors"
)

// Kind is what an override does.
type Kind string

// The kinds of override.
const (
	// KindScale multiplies the requests and burst of every limit in its
	// scope by Factor (> 0).
	KindScale Kind = "scale"
	// KindLimit sets a rule's limit: its global limit, or its local one
	// when it has no global limit.
	KindLimit Kind = "limit"
	// KindBlock refuses every request descriptor in its scope carrying
	// Value (limit 0), with or without a rule.
	KindBlock Kind = "block"
	// KindAllow bypasses the rules in its scope: they answer OK, take no
	// tokens. It needs an expiry.
	KindAllow Kind = "allow"
	// KindShadow puts the rules in its scope in shadow mode: decided and
	// counted, answered OK. It loosens as much as allow does: it needs a
	// domain and an expiry, and protected rules refuse it.
	KindShadow Kind = "shadow"
)

// Kinds lists every kind, in the order of the ratelimit_overrides metric.
func Kinds() []Kind { return []Kind{KindScale, KindLimit, KindBlock, KindAllow, KindShadow} }

// MaxFactor bounds a scale factor; larger factors are typing mistakes.
const MaxFactor = 1000

// Override is one runtime override, as stored (JSON) and listed.
type Override struct {
	// ID identifies the override: derived from its scope and kind (see
	// NewID), so setting the same kind on the same scope replaces it.
	ID string `json:"id"`
	// Domain scopes the override to one domain; empty: every domain
	// (scale and shadow only).
	Domain string `json:"domain,omitempty"`
	// Rule scopes it to one rule of Domain, by its path as /rlconfig
	// shows it (e.g. "edge.user_id"); empty: every rule of the domain.
	Rule string `json:"rule,omitempty"`
	// Value, "key=value", scopes it to request descriptors carrying that
	// entry. Required for block.
	Value string `json:"value,omitempty"`
	Kind  Kind   `json:"kind"`
	// Factor is the scale factor of KindScale.
	Factor float64 `json:"factor,omitempty"`
	// Limit is the limit of KindLimit, "N/unit" (e.g. "10/second").
	Limit string `json:"limit,omitempty"`
	// Burst is KindLimit's bucket capacity; 0: the limit's N.
	Burst uint32 `json:"burst,omitempty"`
	// Reason says why; required.
	Reason string `json:"reason"`
	// Author is who set it, as authenticated by the admin endpoint (a
	// token's name or a client certificate's subject), never a client's
	// claim.
	Author string `json:"author"`
	// Note is free text from the client (rls override set --note).
	Note    string    `json:"note,omitempty"`
	Created time.Time `json:"created"`
	// Expires is when it stops applying; zero: never (not allowed for
	// KindAllow).
	Expires time.Time `json:"expires,omitzero"`
}

// NewID returns the ID of an override with o's scope and kind: the first
// 16 hex digits of the SHA-256 of the length-prefixed fields.
func NewID(o Override) string {
	h := sha256.New()
	for _, f := range []string{o.Domain, o.Rule, o.Value, string(o.Kind)} {
		fmt.Fprintf(h, "%d:%s", len(f), f)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Active reports whether o applies at now.
func (o Override) Active(now time.Time) bool {
	return o.Expires.IsZero() || now.Before(o.Expires)
}

// Scope describes o's scope for humans: "everything", "domain edge",
// "rule edge.user_id", with " where api_key=x" when Value is set.
func (o Override) Scope() string {
	s := "everything"
	switch {
	case o.Rule != "":
		s = "rule " + o.Rule
	case o.Domain != "":
		s = "domain " + o.Domain
	}
	if o.Value != "" {
		s += " where " + o.Value
	}
	return s
}

// Effect describes what o does, e.g. "scale ×1.5", "limit 10/second burst 10".
func (o Override) Effect() string {
	switch o.Kind {
	case KindScale:
		return "scale ×" + strconv.FormatFloat(o.Factor, 'g', -1, 64)
	case KindLimit:
		s := "limit " + o.Limit
		if o.Burst > 0 {
			s += " burst " + strconv.FormatUint(uint64(o.Burst), 10)
		}
		return s
	}
	return string(o.Kind)
}

// String is o's one-line description (rls override set and rm print it):
// the reason quoted, the scope and author quoted when they hold anything
// but printable text (see Quote).
func (o Override) String() string {
	s := fmt.Sprintf("override %s: %s on %s, by %s: %q", Quote(o.ID), o.Effect(), Quote(o.Scope()), Quote(o.Author), o.Reason)
	if !o.Expires.IsZero() {
		s += ", expires " + o.Expires.UTC().Format(time.RFC3339)
	}
	return s
}

// Quote returns s as it is when it is plain printable text, else quoted
// as a Go string (strconv.Quote): newlines, ANSI escapes and other control
// characters, which an override's free text (reason, note, a value) may
// hold, are shown escaped and never reach a terminal raw. A quote or
// backslash is quoted too, so a quoted value cannot be faked.
func Quote(s string) string {
	for _, r := range s {
		if !strconv.IsPrint(r) || r == '"' || r == '\\' {
			return strconv.Quote(s)
		}
	}
	return s
}

// ErrProtected is wrapped by Validate's error when an override would
// loosen a protected rule.
var ErrProtected = errors.New("protected rule")

// Validate checks o on its own and against the rule set cfg (nil: the
// rule-set checks are skipped). It fills nothing in; every problem is
// returned at once.
func Validate(o Override, cfg *descriptors.Config) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if strings.TrimSpace(o.Reason) == "" {
		bad("a reason is required")
	}
	if o.Rule != "" && o.Domain == "" {
		bad("rule %q needs its domain", o.Rule)
	}
	if o.Value != "" {
		if _, _, err := parseValue(o.Value); err != nil {
			errs = append(errs, err)
		}
	}
	switch o.Kind {
	case KindScale:
		if !(o.Factor > 0 && o.Factor <= MaxFactor) || math.IsNaN(o.Factor) {
			bad("scale factor must be above 0 and at most %d, not %v", MaxFactor, o.Factor)
		}
	case KindLimit:
		if o.Rule == "" {
			bad("limit needs a rule")
		}
		if _, err := ParseLimit(o.Limit, o.Burst); err != nil {
			errs = append(errs, err)
		}
	case KindBlock:
		if o.Value == "" {
			bad("block needs a value (key=value) to block")
		}
		if o.Domain == "" {
			bad("block needs a domain")
		}
	case KindAllow:
		if o.Expires.IsZero() {
			bad("allow (bypass) needs an expiry")
		}
		if o.Domain == "" {
			bad("allow needs a domain: bypassing everything is not an override")
		}
	case KindShadow:
		if o.Expires.IsZero() {
			bad("shadow needs an expiry: it answers OK whatever the rules decide")
		}
		if o.Domain == "" {
			bad("shadow needs a domain: shadowing everything turns limiting off")
		}
	default:
		bad("unknown kind %q: want scale, limit, block, allow or shadow", o.Kind)
	}
	if o.Kind != KindScale && o.Factor != 0 {
		bad("factor is for scale only")
	}
	if o.Kind != KindLimit && (o.Limit != "" || o.Burst != 0) {
		bad("limit and burst are for limit only")
	}
	if len(errs) == 0 && cfg != nil {
		errs = append(errs, checkRules(o, cfg)...)
	}
	return errors.Join(errs...)
}

// checkRules checks o against the rule set: its domain and rule exist, and
// it loosens no protected rule.
func checkRules(o Override, cfg *descriptors.Config) []error {
	if o.Domain == "" {
		return nil
	}
	dom := cfg.Domain(o.Domain)
	if dom == nil {
		return []error{fmt.Errorf("domain %q has no rules", o.Domain)}
	}
	var errs []error
	found := false
	for _, r := range dom.Rules() {
		if o.Rule != "" && r.Path != o.Rule {
			continue
		}
		found = true
		if why := loosens(o, r); why != "" && o.Rule != "" {
			errs = append(errs, fmt.Errorf("%w %s: %s", ErrProtected, r.Path, why))
		}
	}
	if o.Rule != "" && !found {
		errs = append(errs, fmt.Errorf("domain %q has no rule %q (see /rlconfig)", o.Domain, o.Rule))
	}
	if o.Rule == "" && (o.Kind == KindAllow || o.Kind == KindShadow) {
		// A domain-wide bypass or shadow skips its protected rules; say so
		// when that leaves nothing to bypass.
		all := true
		for _, r := range dom.Rules() {
			all = all && r.Protected
		}
		if all && len(dom.Rules()) > 0 {
			errs = append(errs, fmt.Errorf("%w: every rule of domain %q is protected; nothing to bypass", ErrProtected, o.Domain))
		}
	}
	return errs
}

// loosens says how o would loosen the protected rule r, or "".
func loosens(o Override, r *descriptors.Rule) string {
	if !r.Protected {
		return ""
	}
	switch o.Kind {
	case KindAllow:
		return "cannot be bypassed"
	case KindShadow:
		return "cannot be shadowed"
	case KindScale:
		if o.Factor > 1 {
			return "cannot be scaled above 1"
		}
	case KindLimit:
		l, err := ParseLimit(o.Limit, o.Burst)
		if err != nil {
			return ""
		}
		if cur := r.Global; cur != nil && looser(l, *cur) || r.Global == nil && r.Local != nil && looser(l, *r.Local) {
			return "cannot be given a higher limit"
		}
	}
	return ""
}

// Loosening reports whether o admits more than the rules it covers in cfg
// would: allow, shadow, a scale above 1, or a limit above the rule's (cfg
// nil: limits are not compared). Loosening overrides need an expiry no
// further than the Manager's MaxLoosenExpiry.
func Loosening(o Override, cfg *descriptors.Config) bool {
	switch o.Kind {
	case KindAllow, KindShadow:
		return true
	case KindScale:
		return o.Factor > 1
	case KindLimit:
		if cfg == nil {
			return false
		}
		l, err := ParseLimit(o.Limit, o.Burst)
		if err != nil {
			return false
		}
		dom := cfg.Domain(o.Domain)
		if dom == nil {
			return false
		}
		for _, r := range dom.Rules() {
			if r.Path != o.Rule {
				continue
			}
			if cur := r.Global; cur != nil && looser(l, *cur) || r.Global == nil && r.Local != nil && looser(l, *r.Local) {
				return true
			}
		}
	}
	return false
}

// looser reports whether l admits more than cur: a higher rate or burst.
func looser(l, cur bucket.Limit) bool {
	// rates compared as requests per period, cross-multiplied exactly
	// enough for the bounds of rule files (uint32 × 100 years in ns fits
	// a float64's precision well below one request).
	lr := float64(l.Requests) / float64(l.Period)
	cr := float64(cur.Requests) / float64(cur.Period)
	return lr > cr || l.Burst > cur.Burst
}

// parseValue splits "key=value".
func parseValue(v string) (key, value string, err error) {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return "", "", fmt.Errorf("value %q: want key=value", v)
	}
	return k, val, nil
}

// ParseLimit parses "N/unit" or "N/M units" (e.g. "10/second",
// "100/5 minutes") into a bucket shape with capacity burst (0: N).
func ParseLimit(s string, burst uint32) (bucket.Limit, error) {
	n, per, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return bucket.Limit{}, fmt.Errorf("limit %q: want N/unit, e.g. 10/second", s)
	}
	req, err := strconv.ParseUint(strings.TrimSpace(n), 10, 32)
	if err != nil {
		return bucket.Limit{}, fmt.Errorf("limit %q: requests: %w", s, err)
	}
	mult := uint64(1)
	unitName := strings.TrimSpace(per)
	if m, u, ok := strings.Cut(unitName, " "); ok {
		if mult, err = strconv.ParseUint(m, 10, 32); err != nil || mult == 0 {
			return bucket.Limit{}, fmt.Errorf("limit %q: want N/M units, M ≥ 1", s)
		}
		unitName = strings.TrimSuffix(strings.TrimSpace(u), "s")
	}
	unit, ok := descriptors.ParseUnit(unitName)
	if !ok {
		return bucket.Limit{}, fmt.Errorf("limit %q: unknown unit %q (second, minute, hour, day, week, month, year)", s, unitName)
	}
	l, err := descriptors.NewLimit(unit, uint32(req), uint32(mult))
	if err != nil {
		return bucket.Limit{}, fmt.Errorf("limit %q: %w", s, err)
	}
	if burst > 0 {
		l.Burst = uint64(burst)
	}
	if l.Requests > 0 && l.Burst == 0 {
		return bucket.Limit{}, fmt.Errorf("limit %q: burst must be ≥ 1", s)
	}
	return l, nil
}
