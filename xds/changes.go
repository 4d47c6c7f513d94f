package xds

import (
	"fmt"
	"log/slog"

	"github.com/sluice-rls/sluice/audit"
	"github.com/sluice-rls/sluice/ruleset"
)

// maxListedChanges is how many rule changes an update lists, in its log
// lines and in its audit event; the rest are summed up in one line and one
// audit.Change (summary). An update replacing a whole fleet's rules would
// otherwise write a log line per rule and an audit event as large as the
// rules rendered twice.
const maxListedChanges = 100

// summaryWhat names the audit.Change that sums up the changes not listed.
const summaryWhat = "(more changes not listed)"

// counts is "N added, N removed, N changed" of changes.
func counts(changes []ruleset.Change) string {
	var added, removed, changed int
	for _, c := range changes {
		switch c.Kind {
		case "added":
			added++
		case "removed":
			removed++
		default:
			changed++
		}
	}
	return fmt.Sprintf("%d rules added, %d removed, %d changed", added, removed, changed)
}

// logChanges logs the first maxListedChanges changes as
// ruleset.LogChanges does, then one line counting the rest.
func logChanges(log *slog.Logger, changes []ruleset.Change) {
	if len(changes) <= maxListedChanges {
		ruleset.LogChanges(log, changes)
		return
	}
	ruleset.LogChanges(log, changes[:maxListedChanges])
	log.Info("more rule changes not listed", "listed", maxListedChanges, "not_listed", len(changes)-maxListedChanges, "in_all", counts(changes))
}

// auditChanges are the Changes of an update's audit event: every changed
// field of the first maxListedChanges rule changes (ruleset.AuditChanges),
// then, when there are more, one Change named summaryWhat whose New counts
// them all ("12 rules added, 0 removed, 3 changed; 100 listed").
func auditChanges(changes []ruleset.Change) []audit.Change {
	if len(changes) <= maxListedChanges {
		return ruleset.AuditChanges(changes)
	}
	out := ruleset.AuditChanges(changes[:maxListedChanges])
	return append(out, audit.Change{What: summaryWhat, New: fmt.Sprintf("%s; %d listed", counts(changes), maxListedChanges)})
}
