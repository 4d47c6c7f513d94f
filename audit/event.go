package audit

import (
	"context"
	"log/slog"
	"time"
)

// Kinds of Event.
const (
	// KindReload: a new rule set was loaded (from files or xDS).
	KindReload = "reload"
	// KindOverrideSet: a runtime override was created or replaced.
	KindOverrideSet = "override.set"
	// KindOverrideRemove: a runtime override was removed by an operator.
	KindOverrideRemove = "override.remove"
	// KindOverrideExpire: a runtime override reached its expiry.
	KindOverrideExpire = "override.expire"
	// KindOverrideRestore: a node found the override store lost (emptied
	// by a Redis restart or flush) and wrote back the overrides it applied.
	KindOverrideRestore = "override.restore"
	// KindApplied: a node applied a change made elsewhere (Subject names it).
	KindApplied = "applied"
	// KindAdaptiveTrigger: an adaptive policy (Subject) lowered its scope's
	// scale below 1; Reason holds the signal values.
	KindAdaptiveTrigger = "adaptive.trigger"
	// KindAdaptiveRestore: an adaptive policy's scale returned to 1.
	KindAdaptiveRestore = "adaptive.restore"
)

// Kinds returns every kind of Event, in the order above.
func Kinds() []string {
	return []string{KindReload, KindOverrideSet, KindOverrideRemove, KindOverrideExpire, KindOverrideRestore, KindApplied, KindAdaptiveTrigger, KindAdaptiveRestore}
}

// Event is one audited change. Its JSON form (lower-case keys, empty
// fields left out) is what `rls audit --json` prints.
type Event struct {
	// Time is when the change was made.
	Time time.Time `json:"time"`
	// Kind is one of the Kind constants.
	Kind string `json:"kind"`
	// Node is the node that made or applied the change.
	Node string `json:"node,omitempty"`
	// Author is who made the change; empty when unknown (a file reload).
	Author string `json:"author,omitempty"`
	// Reason is the author's reason; empty when none was given.
	Reason string `json:"reason,omitempty"`
	// Subject is what changed: a rule set's SHA-256, an override's ID.
	Subject string `json:"subject,omitempty"`
	// Changes lists every changed field, old → new.
	Changes []Change `json:"changes,omitempty"`
}

// Change is one changed field: What names it (e.g. "edge.user_id: unit"),
// Old and New are its values as text, empty when absent.
type Change struct {
	What string `json:"what"`
	Old  string `json:"old"`
	New  string `json:"new"`
}

// Recorder records events. Implementations are safe for concurrent use.
type Recorder interface {
	Record(ctx context.Context, e Event)
}

// Log is a Recorder that writes each event as one info-level line with the
// message "audit" and the event's fields as attributes.
type Log struct {
	Logger *slog.Logger
}

// Record writes e to l.Logger.
func (l Log) Record(ctx context.Context, e Event) {
	attrs := []slog.Attr{
		slog.String("kind", e.Kind),
		slog.Time("at", e.Time),
	}
	for _, a := range []struct{ k, v string }{{"node", e.Node}, {"author", e.Author}, {"reason", e.Reason}, {"subject", e.Subject}} {
		if a.v != "" {
			attrs = append(attrs, slog.String(a.k, a.v))
		}
	}
	if len(e.Changes) > 0 {
		changes := make([]any, len(e.Changes))
		for i, c := range e.Changes {
			changes[i] = slog.Group(c.What, slog.String("old", c.Old), slog.String("new", c.New))
		}
		attrs = append(attrs, slog.Group("changes", changes...))
	}
	l.Logger.LogAttrs(ctx, slog.LevelInfo, "audit", attrs...)
}

// Multi is a Recorder that hands each event to every recorder in order.
type Multi []Recorder

// Record hands e to every recorder of m.
func (m Multi) Record(ctx context.Context, e Event) {
	for _, r := range m {
		r.Record(ctx, e)
	}
}
