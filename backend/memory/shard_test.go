package memory

import (
	"fmt"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/sluice-rls/sluice/bucket"
)

func TestShardLayout(t *testing.T) {
	t.Parallel()
	tests := []struct {
		maxBuckets, want int
		wantN, wantPer   int
	}{
		{maxBuckets: 1, want: maxShards, wantN: 1, wantPer: 1},
		{maxBuckets: 100, want: maxShards, wantN: 1, wantPer: 100},
		{maxBuckets: 128, want: maxShards, wantN: 2, wantPer: 64},
		{maxBuckets: 1000, want: maxShards, wantN: 8, wantPer: 125},
		{maxBuckets: DefaultMaxBuckets, want: maxShards, wantN: 64, wantPer: 1 << 14},
		{maxBuckets: DefaultMaxBuckets, want: 16, wantN: 16, wantPer: 1 << 16},
		{maxBuckets: DefaultMaxBuckets, want: 24, wantN: 16, wantPer: 1 << 16},
		{maxBuckets: DefaultMaxBuckets, want: 1000, wantN: 64, wantPer: 1 << 14},
		{maxBuckets: 1<<20 + 63, want: maxShards, wantN: 64, wantPer: 1<<14 + 0},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d buckets, %d shards wanted", tt.maxBuckets, tt.want), func(t *testing.T) {
			t.Parallel()
			n, per := shardLayout(tt.maxBuckets, tt.want)
			if n != tt.wantN || per != tt.wantPer {
				t.Errorf("shardLayout(%d, %d) = %d, %d; want %d, %d", tt.maxBuckets, tt.want, n, per, tt.wantN, tt.wantPer)
			}
			if n*per > tt.maxBuckets {
				t.Errorf("%d shards × %d buckets exceeds %d", n, per, tt.maxBuckets)
			}
		})
	}
}

// TestShardIndexSpread checks that sequential keys, which are not hashes,
// still spread evenly over the shards.
func TestShardIndexSpread(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 2, 16, 64} {
		t.Run(fmt.Sprintf("%d shards", n), func(t *testing.T) {
			t.Parallel()
			l := newLimiter(Options{}, n)
			counts := make([]int, len(l.shards))
			const keys = 1 << 16
			for i := range uint64(keys) {
				k := key(i)
				counts[shardIndex(&k, l.shift)]++ // panics if out of range
			}
			mean := keys / len(counts)
			for i, c := range counts {
				if c < mean*8/10 || c > mean*12/10 {
					t.Errorf("shard %d holds %d of %d keys, want about %d", i, c, keys, mean)
				}
			}
		})
	}
}

// BenchmarkShards sizes the shard count: three-hit calls from every
// goroutine, on keys of their own. Run it at -cpu 1,2,4 (and more where
// available); contention shows as ns/op growing with fewer shards.
func BenchmarkShards(b *testing.B) {
	roomy := bucket.Limit{Requests: 1 << 40, Period: 1 << 30, Burst: 1 << 40}
	for _, n := range []int{1, 4, 16, 64} {
		b.Run(fmt.Sprintf("%d shards", n), func(b *testing.B) {
			b.ReportAllocs()
			l := newLimiter(Options{}, n)
			var next atomic.Uint64
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				g := next.Add(1) << 32
				// Each goroutine cycles over 1024 keys so calls spread
				// over the shards as real traffic does.
				var hits [1024]bucket.Hit
				for i := range hits {
					hits[i] = bucket.Hit{Key: key(g + uint64(i)), Limit: roomy, Cost: 1}
				}
				states := make([]bucket.State, 3)
				for i := 0; pb.Next(); i = (i + 3) % (len(hits) - 2) {
					l.HitAt(t0, hits[i:i+3], states)
				}
			})
		})
	}
}

// TestShardFillsCacheLines checks shard's padding: neighbouring shards'
// mutexes must not share a cache line.
func TestShardFillsCacheLines(t *testing.T) {
	t.Parallel()
	if size := unsafe.Sizeof(shard{}); size%64 != 0 {
		t.Errorf("a shard is %d bytes, not a multiple of a 64-byte cache line", size)
	}
}
