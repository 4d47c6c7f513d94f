package memory

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/sluice-rls/sluice/bucket"
)

// BenchmarkBucketMemory measures what a bucket costs: each iteration fills a
// Limiter of MaxBuckets n to the brim with partly drained buckets, one
// single-hit call each, and reports the heap still in use afterwards
// (live-B/bucket, after a collection) and all that the fill allocated,
// including the tables that map growth left behind (alloc-B/bucket). With
// GOGC=100 the heap may reach about twice the live figure between
// collections. Run it with -benchtime 3x; ns/op is the time to fill.
func BenchmarkBucketMemory(b *testing.B) {
	for _, n := range []int{1 << 16, DefaultMaxBuckets} {
		b.Run(fmt.Sprintf("%d buckets", n), func(b *testing.B) {
			keys := fillingKeys(New(Options{MaxBuckets: n}), 0)
			hits := []bucket.Hit{{Limit: onePerHour, Cost: 1}}
			states := make([]bucket.State, 1)
			var live, alloc, held float64
			for b.Loop() {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				l := New(Options{MaxBuckets: n})
				for _, k := range keys {
					hits[0].Key = k
					if !l.HitAt(t0, hits, states) {
						b.Fatalf("key refused with room to spare: %+v", states[0])
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				held += float64(l.Len())
				live += float64(after.HeapAlloc) - float64(before.HeapAlloc)
				alloc += float64(after.TotalAlloc - before.TotalAlloc)
				runtime.KeepAlive(l)
			}
			b.ReportMetric(live/held, "live-B/bucket")
			b.ReportMetric(alloc/held, "alloc-B/bucket")
		})
	}
}
