package fallback

import "fmt"

// Mode says what the global layer does while the primary is failing
// (--redis-failure).
type Mode int

const (
	// Share enforces global rules in memory at this node's share:
	// rate/N and burst/N (at least one token), N the live node count.
	Share Mode = iota
	// Local skips the global layer; the local layer still limits.
	Local
	// Allow answers OK to every request, the local layer included.
	Allow
	// Deny refuses every request that has a global limit.
	Deny
)

// Modes lists every Mode, in the order of --redis-failure's help.
func Modes() []Mode { return []Mode{Share, Local, Allow, Deny} }

// String returns the --redis-failure spelling of m.
func (m Mode) String() string {
	switch m {
	case Local:
		return "local"
	case Allow:
		return "allow"
	case Deny:
		return "deny"
	}
	return "share"
}

// MarshalText implements encoding.TextMarshaler, for flag.TextVar.
func (m Mode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler: it parses a
// --redis-failure value.
func (m *Mode) UnmarshalText(b []byte) error {
	for _, c := range Modes() {
		if c.String() == string(b) {
			*m = c
			return nil
		}
	}
	return fmt.Errorf("unknown failure mode %q (want share, local, allow or deny)", b)
}
