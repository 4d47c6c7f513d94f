package lease

import "fmt"

// Consistency says how a global bucket is decided: in Redis on every
// request (Exact), or from tokens a node leased from it ahead of time
// (Leased). docs/design.md, "Leased global buckets", compares them.
type Consistency uint8

const (
	// Exact decides every hit in the shared store.
	Exact Consistency = iota
	// Leased decides hits from leased tokens, never admitting more than
	// Exact would.
	Leased
)

// DefaultConsistency is --consistency's default: global buckets are
// exact unless a rule says leased.
const DefaultConsistency = Exact

// MarshalText returns String's text.
func (c Consistency) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalText parses "exact" or "leased" (a flag's value).
func (c *Consistency) UnmarshalText(b []byte) error {
	switch string(b) {
	case "exact":
		*c = Exact
	case "leased":
		*c = Leased
	default:
		return fmt.Errorf("consistency %q: want exact or leased", b)
	}
	return nil
}

// String returns "exact" or "leased".
func (c Consistency) String() string {
	if c == Leased {
		return "leased"
	}
	return "exact"
}

// Rule is what the layer reads of a hit's rule (bucket.Hit.Rule), which
// descriptors.Rule implements. A hit whose Rule does not implement it has
// the layer's Default.
type Rule interface {
	// Leased reports whether the rule's global bucket is leased: as the
	// rule's own consistency says, else def (the layer's Default).
	Leased(def bool) bool
}
