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

// logChanges logs the listed changes as ruleset.LogChanges does, then,
// when n counts more, one line counting the rest.
func logChanges(log *slog.Logger, changes []ruleset.Change, n ruleset.Counts) {
	ruleset.LogChanges(log, changes)
	if more := n.Total() - len(changes); more > 0 {
		log.Info("more rule changes not listed", "listed", len(changes), "not_listed", more, "in_all", n.String())
	}
}

// auditChanges are the Changes of an update's audit event: every changed
// field of the listed rule changes (ruleset.AuditChanges), then, when n
// counts more, one Change named summaryWhat whose New counts them all
// ("12 rules added, 0 removed, 3 changed; 100 listed").
func auditChanges(changes []ruleset.Change, n ruleset.Counts) []audit.Change {
	out := ruleset.AuditChanges(changes)
	if n.Total() > len(changes) {
		out = append(out, audit.Change{What: summaryWhat, New: fmt.Sprintf("%s; %d listed", n, len(changes))})
	}
	return out
}
