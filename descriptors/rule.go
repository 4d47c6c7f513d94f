package descriptors

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-rls/sluice/bucket"
)

// Rule is one descriptor of a rule file that carries a rate_limit, with
// everything matching, keying and reporting need. Rules are immutable and
// shared by every request; never modify one.
type Rule struct {
	// Domain is the rule's domain.
	Domain string
	// Path names the rule: the domain, then one element per level joined
	// by ".", each the level's key, or key + "_" + value when the level has
	// a value (an exact value, or a wildcard pattern as written, '*'
	// included). For example "edge.route_/api/orders.user_id". It is the
	// rule's metric label (see MetricLabel) and, together with Domain, its
	// identity across reloads: New rejects two rules of one domain with the
	// same Path. Like envoyproxy/ratelimit's stats keys it is for humans and
	// metrics, not an unambiguous encoding; bucket keys never use it.
	Path string
	// Name is rate_limit.name, empty when unset.
	Name string
	// Replaces lists the names of the rules this rule replaces when both
	// match one request (envoyproxy/ratelimit semantics: the replaced rules
	// are neither checked nor counted).
	Replaces []string
	// Unlimited rules match but are never limited; Global and Local are nil.
	Unlimited bool
	// Global is the cluster-wide bucket shape; nil for an unlimited or a
	// local-only rule.
	Global *bucket.Limit
	// Local is the per-node bucket shape; nil without a local block.
	Local *bucket.Limit
	// GlobalRate and LocalRate are Global and Local as written (unit and
	// multiplier), for the response's current_limit; nil when absent.
	GlobalRate, LocalRate *Rate
	// ShadowMode: decide and count, but answer OK.
	ShadowMode bool
	// QuotaMode: the rule's refusal refuses the request only when every
	// quota rule of the request refuses (Descriptor.QuotaMode).
	QuotaMode bool
	// Postpaid: a hit past the limit is charged all the same, into debt
	// (Descriptor.Postpaid); QuotaMode implies it.
	Postpaid bool
	// Protected: runtime overrides may tighten the rule, never loosen it
	// (Descriptor.Protected).
	Protected bool
	// Metadata is the rule's metadata as decoded (Descriptor.Metadata);
	// nil when none. Shared by every request: never modify it.
	Metadata map[string]any
	// DetailedMetric: the metric label carries every request value.
	DetailedMetric bool
	// Utilisation: the rule reports the tokens each tenant (Tenant) takes,
	// against its quota (Descriptor.Utilisation).
	Utilisation bool
	// Consistency is rate_limit.consistency: how the global bucket is
	// decided, "exact" or "leased" (package backend/lease, which reads
	// it through Leased); empty when unset (the server's --consistency
	// decides).
	Consistency string
	// Share is rate_limit.share: the part f of the global limit held as
	// standing shares, f/n of it on each of n nodes, decided there with no
	// Redis call (package backend/share); 0 when unset or 0.
	Share float64
	// NoShare is rate_limit.share: 0: the rule holds no standing shares,
	// whatever the server's default (--share) is.
	NoShare bool

	levels  []level
	dynamic bool // MetricLabel depends on the request
	file    string
	pos     pos
}

// Rate is one layer of a rate_limit as written: RequestsPerUnit tokens per
// UnitMultiplier × Unit, bucket capacity Burst.
type Rate struct {
	RequestsPerUnit uint32
	Unit            Unit
	UnitMultiplier  uint32 // ≥ 1
	Burst           uint32
}

// Period returns UnitMultiplier × Unit.
func (r Rate) Period() time.Duration {
	return time.Duration(max(r.UnitMultiplier, 1)) * r.Unit.Duration()
}

// Limit returns the bucket shape of the rate.
func (r Rate) Limit() bucket.Limit {
	return bucket.Limit{Requests: uint64(r.RequestsPerUnit), Period: r.Period(), Burst: uint64(r.Burst)}
}

// String returns e.g. "100/second burst 200" or "10/5 minutes burst 10".
func (r Rate) String() string {
	var b strings.Builder
	b.WriteString(strconv.FormatUint(uint64(r.RequestsPerUnit), 10))
	b.WriteByte('/')
	b.WriteString(r.periodString())
	b.WriteString(" burst ")
	b.WriteString(strconv.FormatUint(uint64(r.Burst), 10))
	return b.String()
}

// periodString returns "second" or, with a multiplier, "5 seconds".
func (r Rate) periodString() string {
	if r.UnitMultiplier <= 1 {
		return r.Unit.String()
	}
	return strconv.FormatUint(uint64(r.UnitMultiplier), 10) + " " + r.Unit.String() + "s"
}

// valueKind is how a rule level matches the request value. The numbers are
// part of the bucket-key encoding: never renumber.
type valueKind uint8

const (
	keyOnly  valueKind = 0 // any value
	exact    valueKind = 1 // this value only
	wildcard valueKind = 2 // values matching a '*' pattern
)

// level is one entry of a rule's path.
type level struct {
	key           string
	value         string // exact value or pattern text; "" when keyOnly
	kind          valueKind
	valueToMetric bool
	share         bool // share_threshold: all matching values share a bucket
}

// showsValue reports whether the level's metric label shows the request's
// value rather than the configured one.
func (l level) showsValue(detailed bool) bool {
	return (detailed || l.valueToMetric) && !l.share
}

func (l level) pathElem() string {
	if l.kind == keyOnly {
		return l.key
	}
	return l.key + "_" + l.value
}

// Levels returns the number of entries a request descriptor has when it
// matches this rule.
func (r *Rule) Levels() int { return len(r.levels) }

// Source returns "file:line:column" of the descriptor that defines the rule.
func (r *Rule) Source() string {
	return r.file + ":" + r.pos.String()
}

// Leased reports whether the rule's global bucket is leased: as its
// Consistency says, else def, the server's default (--consistency).
// backend/lease reads it from a hit's rule (bucket.Hit.Rule).
func (r *Rule) Leased(def bool) bool {
	switch r.Consistency {
	case "leased":
		return true
	case "exact":
		return false
	}
	return def
}

// ShareMillionths returns the rule's share in millionths: its own Share,
// at least 1 and at most 999999, when set; else def, the server's default
// (--share), when the rule may hold shares (a global limit, no charges:
// neither postpaid nor a quota, and not NoShare); else 0. backend/share
// reads it from a hit's rule (bucket.Hit.Rule).
func (r *Rule) ShareMillionths(def uint32) uint32 {
	switch {
	case r.Share > 0:
		return Millionths(r.Share)
	case r.NoShare || r.Global == nil || r.Postpaid || r.QuotaMode:
		return 0
	}
	return def
}

// Millionths returns a share 0 < f < 1 in millionths, at least 1 and at
// most 999999; 0 for f ≤ 0.
func Millionths(f float64) uint32 {
	if !(f > 0) {
		return 0
	}
	return uint32(min(max(math.Round(f*1e6), 1), 999999))
}

// knownConsistency reports whether s is a rate_limit's consistency:
// "exact", "leased" or "" (unset).
func knownConsistency(s string) bool { return s == "" || s == "exact" || s == "leased" }

// String returns the rule's /rlconfig line, "<path>: <limits>", e.g.
// "edge.remote_address: global 1000/second burst 2000, local 3200/second burst 64",
// followed by ", exact" or ", leased" (a global rule's consistency), ", share F", ", shadow_mode",
// ", quota_mode", ", postpaid", ", protected", ", utilisation", ", name N" and ", replaces A B"
// when set (postpaid only when quota_mode does not imply it).
func (r *Rule) String() string {
	var b strings.Builder
	b.WriteString(r.Path)
	b.WriteString(": ")
	switch {
	case r.Unlimited:
		b.WriteString("unlimited")
	default:
		sep := ""
		if r.GlobalRate != nil {
			b.WriteString("global ")
			b.WriteString(r.GlobalRate.String())
			sep = ", "
		}
		if r.LocalRate != nil {
			b.WriteString(sep)
			b.WriteString("local ")
			b.WriteString(r.LocalRate.String())
		}
	}
	if r.Consistency != "" && r.GlobalRate != nil {
		b.WriteString(", ")
		b.WriteString(r.Consistency)
	}
	if (r.Share > 0 || r.NoShare) && r.GlobalRate != nil {
		b.WriteString(", share ")
		b.WriteString(strconv.FormatFloat(r.Share, 'g', -1, 64))
	}
	if r.ShadowMode {
		b.WriteString(", shadow_mode")
	}
	if r.QuotaMode {
		b.WriteString(", quota_mode")
	} else if r.Postpaid {
		b.WriteString(", postpaid")
	}
	if r.Protected {
		b.WriteString(", protected")
	}
	if r.Utilisation {
		b.WriteString(", utilisation")
	}
	if r.Name != "" {
		b.WriteString(", name ")
		b.WriteString(r.Name)
	}
	if len(r.Replaces) > 0 {
		b.WriteString(", replaces ")
		b.WriteString(strings.Join(r.Replaces, " "))
	}
	return b.String()
}

// MetricLabel returns the rule label for metrics of a request descriptor
// that matched r: r.Path, except that levels with value_to_metric, and all
// levels when detailed_metric is set, show the request's value instead of
// the configured one ("key_value"; just "key" when the value is empty).
// A share_threshold level always shows its wildcard pattern: its values
// share one bucket, so they share one series too (and a client cannot grow
// the series count by sending new values). It allocates only when some
// level shows a request value. entries must be the descriptor that
// matched; with any other length it returns r.Path.
func (r *Rule) MetricLabel(entries []Entry) string {
	if !r.dynamic || len(entries) != len(r.levels) {
		return r.Path
	}
	var b strings.Builder
	b.WriteString(r.Domain)
	for i, l := range r.levels {
		b.WriteByte('.')
		if l.showsValue(r.DetailedMetric) {
			b.WriteString(l.key)
			if v := entries[i].Value; v != "" {
				b.WriteByte('_')
				b.WriteString(v)
			}
			continue
		}
		b.WriteString(l.pathElem())
	}
	return b.String()
}

// Tenant returns the tenant of a request descriptor that matched r, the
// label of its utilisation metrics: the request's value of the rule's last
// level; that level's configured value when it has share_threshold (its
// values share one bucket, so one quota). entries must be the descriptor
// that matched; with any other length it returns "".
func (r *Rule) Tenant(entries []Entry) string {
	if len(entries) != len(r.levels) || len(entries) == 0 {
		return ""
	}
	if l := r.levels[len(r.levels)-1]; l.share {
		return l.value
	}
	return entries[len(entries)-1].Value
}
