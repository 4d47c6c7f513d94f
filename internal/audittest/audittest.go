// Package audittest holds an audit.Recorder that tests read back.
package audittest

import (
	"context"
	"sync"

	"github.com/sluice-rls/sluice/audit"
)

// Recorder is an audit.Recorder that keeps every event it is handed. The
// zero value is ready to use; it is safe for concurrent use.
type Recorder struct {
	mu     sync.Mutex
	events []audit.Event
}

// Record keeps e.
func (r *Recorder) Record(_ context.Context, e audit.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

// Events returns a copy of the events recorded so far, in order.
func (r *Recorder) Events() []audit.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]audit.Event(nil), r.events...)
}
