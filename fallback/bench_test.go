package fallback_test

import (
	"context"
	"errors"
	"testing"

	"github.com/sluice-rls/sluice/backend/memory"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/fallback"
)

// BenchmarkHitOnPrimary is a decision through the switch while the primary
// answers, by failure mode: share tracks the node's use in its share, the
// others do not.
func BenchmarkHitOnPrimary(b *testing.B) {
	for _, mode := range []fallback.Mode{fallback.Local, fallback.Share} {
		b.Run(mode.String(), func(b *testing.B) {
			sw := fallback.New(fallback.Options{
				Primary: &primary{mem: memory.New(memory.Options{})},
				Share:   memory.New(memory.Options{}),
				Probe:   func(context.Context) error { return errors.New("down") },
				Nodes:   func() int { return 3 },
				Mode:    mode,
			})
			defer sw.Close()
			hits := []bucket.Hit{
				{Key: bucket.Key{1}, Limit: bucket.Limit{Requests: 1e9, Period: 1e9, Burst: 1e9}, Cost: 1},
				{Key: bucket.Key{2}, Limit: bucket.Limit{Requests: 1e9, Period: 1e9, Burst: 1e9}, Cost: 1},
				{Key: bucket.Key{3}, Limit: bucket.Limit{Requests: 1e9, Period: 1e9, Burst: 1e9}, Cost: 1},
			}
			states := make([]bucket.State, len(hits))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := sw.Hit(context.Background(), hits, states); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
