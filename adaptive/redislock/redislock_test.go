package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/sluice-rls/sluice/adaptive"
	"github.com/sluice-rls/sluice/adaptive/redislock"
	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/internal/redistest"
	"github.com/sluice-rls/sluice/override"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// lockTTL is the tests' lock TTL: longer than any pause of a loaded
// machine between two calls. A test that needs the lock to run out plays
// Redis' clock with expire, rather than waiting for the TTL.
const lockTTL = time.Minute

// expire shortens the lock key's TTL on Redis to d, as if all but d of it
// had passed without a renewal, and checks beforehand that its holder set
// it to lockTTL (a renewal or a take sets PX; at most lockTTL is left).
func expire(t *testing.T, c *goredis.Client, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	if left, err := c.PTTL(ctx, redislock.DefaultKey).Result(); err != nil || left <= lockTTL-10*time.Second || left > lockTTL {
		t.Fatalf("PTTL of the held lock = %v, %v; want about %v", left, err, lockTTL)
	}
	if err := c.PExpire(ctx, redislock.DefaultKey, d).Err(); err != nil {
		t.Fatal(err)
	}
}

func TestOneHolderAndHandover(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client()
	defer c.Close()
	ctx := context.Background()
	a := redislock.New(redislock.Options{Client: c, Holder: "a", TTL: lockTTL})
	b := redislock.New(redislock.Options{Client: c, Holder: "b", TTL: lockTTL})
	if ok, err := a.Hold(ctx); !ok || err != nil {
		t.Fatalf("a.Hold on a free lock = %v, %v", ok, err)
	}
	for range 3 {
		if ok, err := b.Hold(ctx); ok || err != nil {
			t.Fatalf("b.Hold while a holds = %v, %v; want false", ok, err)
		}
		expire(t, c, time.Hour) // a's renewal must set the TTL again (checked by the next expire)
		if ok, _ := a.Hold(ctx); !ok {
			t.Fatal("a lost its renewed lock")
		}
	}
	// a stops renewing (its node died): b takes over once the TTL ran out.
	expire(t, c, time.Millisecond)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, err := b.Hold(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("b never took the lock a stopped renewing")
		}
		time.Sleep(time.Millisecond) // polling a Redis TTL, not waiting for our own state
	}
	if ok, _ := a.Hold(ctx); ok {
		t.Error("a took the lock back while b holds it")
	}
	// a's release does not free b's lock; b's does.
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, _ := b.Hold(ctx); !ok {
		t.Error("a's release freed b's lock")
	}
	if err := b.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, _ := a.Hold(ctx); !ok {
		t.Error("after b's release, a could not take the lock")
	}
}

// TestTwoControllersOneActor runs two controllers on one Redis lock: one
// evaluates and writes, the other does not; when the actor stops, the
// other takes over.
func TestTwoControllersOneActor(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := srv.Client()
	defer c.Close()
	rulesFile, err := descriptors.Parse("r.yaml", []byte("domain: edge\ndescriptors:\n  - key: user_id\n    rate_limit: {unit: second, requests_per_unit: 100}\n"))
	if err != nil {
		t.Fatal(err)
	}
	rules, err := descriptors.New([]*descriptors.File{rulesFile}, descriptors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	type node struct {
		ctl *adaptive.Controller
		mgr *override.Manager
		src *countSource
	}
	mk := func(name string) node {
		cfg, err := adaptive.Parse([]byte("prometheus: http://127.0.0.1:1\nlock_ttl: 1m\npolicies:\n  - name: latency\n    domain: edge\n    interval: 20s\n    signals: [{name: p99, query: p99, lower_above: 1, raise_below: 0.2}]\n"))
		if err != nil {
			t.Fatal(err)
		}
		store, _ := override.OpenFile("")
		getRules := func() *descriptors.Config { return rules }
		mgr := override.NewManager(override.ManagerOptions{Store: store, Rules: getRules})
		src := &countSource{}
		return node{adaptive.New(adaptive.Options{Config: cfg, Source: src, Overrides: mgr, Rules: getRules,
			Lock: redislock.New(redislock.Options{Client: c, Holder: name, TTL: cfg.LockTTL}), Clock: clockwork.NewRealClock()}), mgr, src}
	}
	a, b := mk("a"), mk("b")
	ctx := context.Background()
	a.ctl.Step(ctx)
	b.ctl.Step(ctx)
	if a.src.n != 1 || b.src.n != 0 || len(a.mgr.List()) != 1 || len(b.mgr.List()) != 0 {
		t.Fatalf("a queried %d times and wrote %v, b queried %d times and wrote %v: want a alone", a.src.n, a.mgr.List(), b.src.n, b.mgr.List())
	}
	expire(t, c, time.Millisecond) // a is gone, and its lock ran out
	deadline := time.Now().Add(10 * time.Second)
	for b.src.n == 0 { // b steps until it acts
		if time.Now().After(deadline) {
			t.Fatal("b never became the actor after a stopped")
		}
		time.Sleep(time.Millisecond) // polling a Redis TTL
		b.ctl.Step(ctx)
	}
	if len(b.mgr.List()) != 1 {
		t.Errorf("the new actor wrote %v, want its scale override", b.mgr.List())
	}
}

// countSource answers 2 to every query and counts them; one goroutine
// steps each controller.
type countSource struct{ n int }

func (s *countSource) Query(context.Context, string) (float64, error) { s.n++; return 2, nil }
