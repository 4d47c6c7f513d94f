// Package audit records changes to what decides requests — rule reloads and
// runtime overrides — as structured events, so an operator can answer who
// changed what, when, why, and when each node applied it.
//
// Event is the record; Recorder is what the packages that make changes
// (ruleset, overrides) hand their events to. Log writes events to a
// *slog.Logger. A Recorder must be safe for concurrent use and must not
// block the caller for long: a recorder that writes to a remote store bounds
// its own time.
//
// Package audit/redisaudit keeps the events in a capped Redis stream as
// well, which `rls audit` reads.
package audit
