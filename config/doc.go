// Package config holds sluice's process settings (flags with RLS_*
// environment equivalents), reads rule files and directories into a
// descriptors.Config, and keeps the current rule set for hot reload.
//
// It imports descriptors only; never service or the backends.
package config
