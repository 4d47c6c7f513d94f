package ruleset

// SettleDelay is settleDelay, for the tests that advance a fake clock past
// the watcher's settle timer.
const SettleDelay = settleDelay

// MaxSettleRounds is maxSettleRounds.
const MaxSettleRounds = maxSettleRounds
