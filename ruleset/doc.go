// Package ruleset reads rule files and directories into a
// descriptors.Config, keeps the current rule set (Store) and reloads it on
// demand and when the files change (Reloader).
//
// It imports descriptors only; never service or the backends. Process
// flags are cmd/rls's (package cmd/rls/flags).
package ruleset
