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
	// KindApplied: a node applied a change made elsewhere (Subject names it).
	KindApplied = "applied"
)

// Event is one audited change.
type Event struct {
	// Time is when the change was made.
	Time time.Time
	// Kind is one of the Kind constants.
	Kind string
	// Node is the node that made or applied the change.
	Node string
	// Author is who made the change; empty when unknown (a file reload).
	Author string
	// Reason is the author's reason; empty when none was given.
	Reason string
	// Subject is what changed: a rule set's SHA-256, an override's ID.
	Subject string
	// Changes lists every changed field, old → new.
	Changes []Change
}

// Change is one changed field: What names it (e.g. "edge.user_id: unit"),
// Old and New are its values as text, empty when absent.
type Change struct {
	What, Old, New string
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
