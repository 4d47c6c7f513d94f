package adaptive

import "context"

// Lock makes one node of a fleet the actor: the only one that evaluates
// the policies and writes the scale.
type Lock interface {
	// Hold takes the lock or renews it; it reports whether this node holds
	// it now. An error means it does not: a node that cannot tell stops
	// acting.
	Hold(ctx context.Context) (bool, error)
	// Release gives the lock up if this node holds it, so another node
	// takes over without waiting for it to expire.
	Release(ctx context.Context) error
}

// Solo is the Lock of a node without a shared store: it always holds it,
// and adapts the overrides of its own store only.
type Solo struct{}

// Hold reports true.
func (Solo) Hold(context.Context) (bool, error) { return true, nil }

// Release does nothing.
func (Solo) Release(context.Context) error { return nil }
