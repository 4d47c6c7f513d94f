package ruleset

import (
	"sync/atomic"

	"github.com/sluice-rls/sluice/descriptors"
)

// Store holds the current rule set. Reads are one atomic load; a reload
// builds a whole new set and swaps it in, so a request sees the old rules or
// the new ones, never a mix. The zero value holds no rules; use NewStore.
type Store struct {
	cur atomic.Pointer[descriptors.Config]
}

// NewStore returns a Store holding cfg.
func NewStore(cfg *descriptors.Config) *Store {
	s := new(Store)
	s.cur.Store(cfg)
	return s
}

// Rules returns the current rule set.
func (s *Store) Rules() *descriptors.Config { return s.cur.Load() }

// Swap replaces the rule set and returns the previous one.
func (s *Store) Swap(cfg *descriptors.Config) *descriptors.Config { return s.cur.Swap(cfg) }
