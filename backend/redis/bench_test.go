package redis_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/internal/redistest"
)

// wireCounter counts, on the connections of one Redis server, the round
// trips (a command alone or a pipeline: one write, one read) and the script
// calls (EVALSHA or EVAL) they carried.
type wireCounter struct{ trips, scripts *atomic.Int64 }

func (wireCounter) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h wireCounter) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		h.trips.Add(1)
		if isScript(cmd) {
			h.scripts.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h wireCounter) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		h.trips.Add(1)
		for _, c := range cmds {
			if isScript(c) {
				h.scripts.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

func isScript(cmd goredis.Cmder) bool {
	n := cmd.Name()
	return n == "evalsha" || n == "eval"
}

// countWire adds a wireCounter to c's server connections: to every node of a
// Redis Cluster (whose own hooks see one call per command or pipeline, not
// per node), or to c itself.
func countWire(c goredis.UniversalClient, w wireCounter) {
	if cc, ok := c.(*goredis.ClusterClient); ok {
		cc.OnNewNode(func(n *goredis.Client) { n.AddHook(w) })
		return
	}
	c.AddHook(w)
}

// BenchmarkHitParallel measures Limiter.Hit from many goroutines on a real
// redis-server (and a 3-master cluster): par=1 runs GOMAXPROCS callers,
// par=32 runs 32×GOMAXPROCS (64 at -cpu 2). Buckets never run out, so every
// hit reaches Redis. calls/op is script calls per Hit, trips/op Redis round
// trips per Hit (a pipeline to one server is one), redis-µs/op the CPU time
// Redis spent (INFO cpu, every master) per Hit.
func BenchmarkHitParallel(b *testing.B) {
	b.Run("single", func(b *testing.B) {
		benchHit(b, "redis://"+redistest.Start(b).Addr())
	})
	b.Run("cluster", func(b *testing.B) {
		benchHit(b, strings.Join(redistest.StartCluster(b, 3).Addrs(), ","))
	})
}

func benchHit(b *testing.B, url string) {
	for _, keys := range []int{1, 3} {
		for _, par := range []int{1, 32} {
			b.Run(fmt.Sprintf("keys=%d/par=%d", keys, par), func(b *testing.B) {
				benchHitN(b, url, keys, par)
			})
		}
	}
}

func benchHitN(b *testing.B, url string, keys, par int) {
	opts, err := redisbackend.ParseURL(url, time.Second)
	if err != nil {
		b.Fatal(err)
	}
	opts.PoolSize = 256 // the pool never limits the callers
	c := goredis.NewUniversalClient(opts)
	b.Cleanup(func() { _ = c.Close() })
	var trips, scripts atomic.Int64
	countWire(c, wireCounter{&trips, &scripts})
	l := redisbackend.New(redisbackend.Options{Client: c, Timeout: time.Second, Prefix: "bench", CacheSize: -1})
	b.Cleanup(l.Close)

	const buckets = 1024
	lim := bucket.Limit{Requests: 1 << 40, Period: time.Second, Burst: 1 << 40}
	table := make([]bucket.Key, buckets)
	for i := range table {
		sum := sha256.Sum256(fmt.Appendf(nil, "bench/%d", i))
		table[i] = bucket.Key(sum[:16])
	}
	// Warm up: scripts loaded, connections open, cluster slots known.
	warm := []bucket.Hit{{Key: table[0], Limit: lim, Cost: 1}}
	if _, err := l.Hit(context.Background(), warm, make([]bucket.State, 1)); err != nil {
		b.Fatal(err)
	}
	trips.Store(0)
	scripts.Store(0)
	cpu0 := redisCPU(b, c)
	var next atomic.Int64
	var failed atomic.Int64
	b.SetParallelism(par)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		g := int(next.Add(1))
		hits := make([]bucket.Hit, keys)
		states := make([]bucket.State, keys)
		ctx := context.Background()
		for i := g * 7919; pb.Next(); i++ {
			for j := range hits {
				hits[j] = bucket.Hit{Key: table[(i+j*331)%buckets], Limit: lim, Cost: 1}
			}
			if _, err := l.Hit(ctx, hits, states); err != nil {
				failed.Add(1)
			}
		}
	})
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d of %d hits failed", n, b.N)
	}
	b.ReportMetric(float64(scripts.Load())/float64(b.N), "calls/op")
	b.ReportMetric(float64(trips.Load())/float64(b.N), "trips/op")
	b.ReportMetric((redisCPU(b, c)-cpu0).Seconds()*1e6/float64(b.N), "redis-µs/op")
}

// redisCPU returns the CPU time (user + system) the Redis servers behind c
// have used, summed over the masters of a cluster.
func redisCPU(b *testing.B, c goredis.UniversalClient) time.Duration {
	b.Helper()
	ctx := context.Background()
	var total atomic.Int64
	read := func(ctx context.Context, r *goredis.Client) error {
		info, err := r.Info(ctx, "cpu").Result()
		if err != nil {
			return err
		}
		for line := range strings.SplitSeq(info, "\n") {
			k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
			if k == "used_cpu_user" || k == "used_cpu_sys" {
				sec, err := strconv.ParseFloat(v, 64)
				if err != nil {
					return fmt.Errorf("INFO cpu %s: %w", k, err)
				}
				total.Add(int64(sec * 1e9))
			}
		}
		return nil
	}
	var err error
	switch r := c.(type) {
	case *goredis.ClusterClient:
		err = r.ForEachMaster(ctx, read)
	case *goredis.Client:
		err = read(ctx, r)
	default:
		err = fmt.Errorf("redisCPU: client %T", c)
	}
	if err != nil {
		b.Fatal(err)
	}
	return time.Duration(total.Load())
}
