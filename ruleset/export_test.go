package ruleset

import "os"

// SettleDelay is settleDelay, for the tests that advance a fake clock past
// the watcher's settle timer.
const SettleDelay = settleDelay

// MaxSettleRounds is maxSettleRounds.
const MaxSettleRounds = maxSettleRounds

// RuleFilesWithin is RuleFiles with other bounds than MaxRuleDepth,
// MaxRuleDirs and MaxRuleFiles, so that tests need not build trees of
// thousands of entries.
func RuleFilesWithin(path string, depth, dirs, files int) ([]string, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	w := ruleWalk{seen: map[fileID]bool{}, bounds: walkBounds{depth, dirs, files}}
	err = w.dir(path, info, 0)
	return w.names, err
}
