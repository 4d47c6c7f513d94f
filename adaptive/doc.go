// Package adaptive moves limits with the backend's health: a Controller
// evaluates Policies — signals read from a Source (PromQL against a
// Prometheus-compatible API, see Prometheus) and thresholds, steps, bounds,
// an interval and a cooldown — and writes the resulting scale as a runtime
// scale override (package override), so every node applies it the way it
// applies an operator's, and the audit trail records each change with the
// signal values as its reason.
//
// One node of a fleet acts: the Controller writes only while it holds its
// Lock (package adaptive/redislock for a fleet sharing a Redis, Solo for a
// node of its own); the others only read the scale for their metrics.
//
// The decision (Policy.Decide) is pure: the scale, the signal readings and
// the time in, the next scale and why out. Safety lives there: a protected
// rule is never scaled above 1, a missing signal (Prometheus unreachable,
// an empty result, NaN) holds the scale and, after the policy's StaleAfter,
// returns it to 1; a scale changes at most once per Cooldown. An
// operator's scale or limit override on the policy's scope wins: the
// Controller stands aside while one is active.
package adaptive
