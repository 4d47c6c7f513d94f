// Package clocktest is a clock that moves only when told, for tests of code
// that takes a now function (buckets, caches, the fallback's breaker), so
// that bucket math never depends on how fast a test runs.
package clocktest

import (
	"sync/atomic"
	"time"
)

// Clock reads its start instant until Advance moves it. It is safe for
// concurrent use.
type Clock struct {
	start time.Time
	ns    atomic.Int64 // elapsed since start
}

// New returns a Clock at start.
func New(start time.Time) *Clock { return &Clock{start: start} }

// Now returns the clock's instant; it has the signature of time.Now.
func (c *Clock) Now() time.Time { return c.start.Add(c.Elapsed()) }

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// Elapsed returns how far the clock has moved since start.
func (c *Clock) Elapsed() time.Duration { return time.Duration(c.ns.Load()) }
