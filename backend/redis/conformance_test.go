package redis_test

import (
	"context"
	"testing"
	"time"

	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/bucket/buckettest"
	"github.com/sluice-rls/sluice/internal/redistest"
)

// TestConformance runs the bucket contract's suite on a real redis-server
// and on a real 3-master Redis Cluster.
//
// Not parallel with the package's other tests: it starts four more
// redis-servers and runs its scenarios in parallel, and on a 2-core machine
// that load delays the replies of tests that measure real time (testRefill
// fails more often under load).
func TestConformance(t *testing.T) {
	for _, d := range []struct {
		name  string
		env   func(t *testing.T) env
		cache int
	}{
		{"single", func(t *testing.T) env { return singleEnv(redistest.Start(t)) }, 0},
		{"cluster", func(t *testing.T) env { return clusterEnv(redistest.StartCluster(t, 3)) }, 0},
	} {
		t.Run(d.name, func(t *testing.T) {
			t.Parallel()
			buckettest.Run(t, redisHarness(d.env(t), redisbackend.Options{CacheSize: d.cache}))
		})
	}
}

// redisHarness builds each scenario's Limiter on e under opts, with its own
// key prefix; opts.CacheSize 0 turns the empty-bucket cache off.
//
// Buckets run on Redis' clock (the script reads TIME), which no test can
// move: Advance waits real time. It is the one place these tests wait for
// time to pass rather than for a state, so the suite keeps those periods
// short (0.6 s in all, in one scenario) and measures how far Redis' time
// runs behind the scenario's (Subject.Now): that lag is all the slack its
// durations get besides the script's rounding up to microseconds, and a
// run whose lag reaches the scenario's margin is run again (buckettest.Run).
func redisHarness(e env, opts redisbackend.Options) buckettest.Harness {
	return buckettest.Harness{
		New: func(t *testing.T) buckettest.Subject {
			f := e.fixture(t, opts)
			// Connect and load the script before the scenario's first
			// call, so that its lag is the decisions' alone. Set-up, so
			// a generous deadline: on a loaded machine a Cluster client's
			// first call (slots, connections, the script) may take more
			// than the Limiter's 1 s timeout.
			hits := []bucket.Hit{{Key: f.key(0), Limit: slow}}
			states := make([]bucket.State, 1)
			for deadline := time.Now().Add(30 * time.Second); ; {
				_, err := f.l.Hit(context.Background(), hits, states)
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("set-up check: %v", err)
				}
			}
			return buckettest.Subject{Limiter: f.l, Advance: time.Sleep, Now: time.Now}
		},
		Resolution: time.Microsecond,
	}
}
