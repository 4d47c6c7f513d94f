package service

import "github.com/sluice-rls/sluice/descriptors"

// RuleSource hands out the current immutable rule set. Reloads swap the
// value it returns; a request loads it once and uses that set throughout.
type RuleSource interface {
	Rules() *descriptors.Config
}
