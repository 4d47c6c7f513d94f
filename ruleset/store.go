package ruleset

import (
	"sync"
	"sync/atomic"

	"github.com/sluice-rls/sluice/descriptors"
)

// Store holds the current rule set. Reads are one atomic load; a reload
// builds a whole new set and swaps it in, so a request sees the old rules or
// the new ones, never a mix. The zero value holds no rules; use NewStore.
type Store struct {
	cur     atomic.Pointer[descriptors.Config]
	mu      sync.Mutex // one Swap or OnSwap at a time: hooks see the sets in order
	onSwaps []func(*descriptors.Config)
}

// NewStore returns a Store holding cfg.
func NewStore(cfg *descriptors.Config) *Store {
	s := new(Store)
	s.cur.Store(cfg)
	return s
}

// Rules returns the current rule set.
func (s *Store) Rules() *descriptors.Config { return s.cur.Load() }

// Swap replaces the rule set and returns the previous one. The hooks of
// OnSwap see the new set before any request does.
func (s *Store) Swap(cfg *descriptors.Config) *descriptors.Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.onSwaps {
		f(cfg)
	}
	return s.cur.Swap(cfg)
}

// OnSwap calls f with the current rule set, then with each new one just
// before Swap makes it current, one call at a time and in the order of
// the swaps. f must be quick: Swap waits for it.
func (s *Store) OnSwap(f func(*descriptors.Config)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s.cur.Load())
	s.onSwaps = append(s.onSwaps, f)
}
