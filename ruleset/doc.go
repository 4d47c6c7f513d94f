// Package ruleset reads rule files and directories into a
// descriptors.Config, keeps the current rule set (Store) and reloads it on
// demand and when the files change (Reloader).
//
// A reload validates every file and swaps the whole rule set at once: a
// request sees the old rules or the new, never a mix, and a set that fails
// to load leaves the running one in place. Diff names every field that a
// reload changed, rule by rule, for the log and for the reload's audit
// event; xds swaps its updates into the same Store, so both sources of
// rules reload, diff and audit the same way.
package ruleset
