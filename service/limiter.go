package service

import (
	"context"

	"github.com/sluice-rls/sluice/descriptors"
)

// Limiter decides a set of bucket hits all-or-nothing, as descriptors.Hit
// documents. It writes one state per hit into states and reports whether
// every non-independent hit was allowed. An error means the limiter could not
// decide (states are then undefined); the caller fails open or falls back.
//
// backend/memory.Limiter and backend/redis.Limiter implement it.
type Limiter interface {
	Hit(ctx context.Context, hits []descriptors.Hit, states []descriptors.BucketState) (bool, error)
}

// RuleSource hands out the current immutable rule set. Reloads swap the
// value it returns; a request loads it once and uses that set throughout.
type RuleSource interface {
	Rules() *descriptors.Config
}
