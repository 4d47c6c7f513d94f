package redis_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	goredis "github.com/redis/go-redis/v9"

	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/internal/redistest"
)

func TestNodesCountLiveNodes(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	ctx := context.Background()
	newNodes := func(id string) *redisbackend.Nodes {
		return redisbackend.NewNodes(redisbackend.NodesOptions{Client: client, ID: id, TTL: 300 * time.Millisecond})
	}
	a, b := newNodes("a"), newNodes("b")
	if got := a.Count(); got != 1 {
		t.Fatalf("before any heartbeat Count = %d, want 1 (this node)", got)
	}
	for _, n := range []*redisbackend.Nodes{a, b, a} {
		if err := n.Beat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := a.Count(); got != 2 {
		t.Errorf("Count after a and b beat = %d, want 2", got)
	}
	if ttl := client.PTTL(ctx, "sluice:{nodes}").Val(); ttl <= 0 || ttl > 300*time.Millisecond {
		t.Errorf("node set PTTL = %v, want (0, 300ms]", ttl)
	}
	// b stops beating: once its heartbeat expires, a counts only itself.
	deadline := time.Now().Add(5 * time.Second)
	for a.Count() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("b never expired: Count = %d", a.Count())
		}
		time.Sleep(20 * time.Millisecond) // poll interval, bounded by the deadline: b's TTL runs on Redis' clock
		if err := a.Beat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A failed heartbeat keeps the last count.
	srv.Kill()
	if err := a.Beat(ctx); err == nil {
		t.Errorf("Beat against a killed server succeeded")
	}
	if got := a.Count(); got != 1 {
		t.Errorf("Count after a failed beat = %d, want the last seen 1", got)
	}
}

// beatHook sends on beats when a script call (a heartbeat: EVALSHA, or EVAL
// after NOSCRIPT) has succeeded.
type beatHook struct{ beats chan struct{} }

func (beatHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h beatHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		err := next(ctx, cmd)
		if n := cmd.Name(); err == nil && (n == "evalsha" || n == "eval") {
			h.beats <- struct{}{}
		}
		return err
	}
}

func (beatHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}

// TestNodesRun: Run registers the node at once, beats again at every tick
// of its clock, and removes the node from the set when ctx ends.
func TestNodesRun(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	client := srv.Client()
	hook := beatHook{beats: make(chan struct{}, 10)}
	client.AddHook(hook)
	clock := clockwork.NewFakeClockAt(time.Unix(1_000_000, 0))
	const every = time.Hour // on the fake clock: only Advance makes it tick
	n := redisbackend.NewNodes(redisbackend.NodesOptions{Client: client, ID: "gone", Every: every, Timeout: time.Second, Clock: clock})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.Run(ctx, func(err error) { t.Errorf("heartbeat: %v", err) })
	}()
	beat := func(when string) {
		t.Helper()
		select {
		case <-hook.beats:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: no heartbeat within 10s", when)
		}
		if err := admin.ZScore(ctx, "sluice:{nodes}", "gone").Err(); err != nil {
			t.Fatalf("%s: node not registered: %v", when, err)
		}
	}
	beat("Run started")
	// Forget the node; the next tick registers it again.
	if err := admin.ZRem(ctx, "sluice:{nodes}", "gone").Err(); err != nil {
		t.Fatal(err)
	}
	if err := clock.BlockUntilContext(ctx, 1); err != nil { // Run's ticker
		t.Fatal(err)
	}
	clock.Advance(every)
	beat("after a tick")
	cancel()
	<-done
	if err := admin.ZScore(context.Background(), "sluice:{nodes}", "gone").Err(); err == nil {
		t.Errorf("node still registered after Run returned")
	}
}

func TestPing(t *testing.T) {
	srv := redistest.Start(t)
	lim := redisbackend.New(redisbackend.Options{Client: srv.Client()})
	if err := lim.Ping(context.Background()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	srv.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := lim.Ping(ctx); err == nil {
		t.Errorf("Ping of a killed server succeeded")
	}
}

// TestPingRunsTheScript: Ping fails as decisions do when Redis answers PING
// but refuses the script or its write, with the kind Redis says: out of
// memory (maxmemory with noeviction) is oom, an ACL without EVALSHA or
// without SET is noperm. Once Redis accepts the script again, Ping passes.
func TestPingRunsTheScript(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const user = "ACL SETUSER sluice on >s3cret resetchannels ~sluice:* -@all +evalsha +eval +ping +get +set +time +zadd +zremrangebyscore +pexpire +zcard +zrem"
	var args []any
	for _, f := range strings.Fields(user) {
		args = append(args, f)
	}
	if err := admin.Do(ctx, args...).Err(); err != nil {
		t.Fatalf("%s: %v", user, err)
	}
	opts, err := redisbackend.ParseURL("redis://sluice:s3cret@"+srv.Addr()+"/0", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	client := goredis.NewUniversalClient(opts)
	defer client.Close()
	lim := redisbackend.New(redisbackend.Options{Client: client})
	defer lim.Close()
	if err := lim.Ping(ctx); err != nil {
		t.Fatalf("Ping as the least-privilege user: %v", err)
	}
	for _, tt := range []struct {
		name         string
		break_, mend []any
		kind         string
	}{
		{"maxmemory", []any{"CONFIG", "SET", "maxmemory", "1"}, []any{"CONFIG", "SET", "maxmemory", "0"}, redisbackend.KindOOM},
		{"acl evalsha", []any{"ACL", "SETUSER", "sluice", "-evalsha", "-eval"}, []any{"ACL", "SETUSER", "sluice", "+evalsha", "+eval"}, redisbackend.KindNoPerm},
		{"acl set", []any{"ACL", "SETUSER", "sluice", "-set"}, []any{"ACL", "SETUSER", "sluice", "+set"}, redisbackend.KindNoPerm},
	} {
		if err := admin.Do(ctx, tt.break_...).Err(); err != nil {
			t.Fatalf("%v: %v", tt.break_, err)
		}
		err := lim.Ping(ctx)
		if kind := redisbackend.ErrorKind(err); kind != tt.kind {
			t.Errorf("%s: Ping = %v (kind %q), want a failure of kind %q", tt.name, err, kind, tt.kind)
		}
		if err := admin.Do(ctx, tt.mend...).Err(); err != nil {
			t.Fatalf("%v: %v", tt.mend, err)
		}
		if err := lim.Ping(ctx); err != nil {
			t.Errorf("%s mended: Ping = %v, want nil", tt.name, err)
		}
	}
	// The probe wrote its bucket (SET inside the script), and the key
	// expires: none is left a second later.
	stats, err := admin.Info(ctx, "commandstats").Result()
	if err != nil || !strings.Contains(stats, "cmdstat_set:") {
		t.Errorf("no SET ran (%v): the probe must exercise the script's write\n%s", err, stats)
	}
	deadline := time.Now().Add(time.Second)
	for {
		keys, err := admin.Keys(ctx, "sluice:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("probe keys %v still there after 1s, want them expired (TTL %v)", keys, admin.PTTL(ctx, keys[0]).Val())
		}
		time.Sleep(5 * time.Millisecond) // poll interval, bounded by the deadline
	}
}

// clusterACL is docs/redis.md's least-privilege user plus what a cluster
// needs: the slot map (the client) and the probe's CLUSTER INFO and
// CLUSTER MYID.
const clusterACL = "ACL SETUSER sluice on >s3cret resetchannels ~sluice:* -@all +evalsha +eval +ping +get +set +time +zadd +zremrangebyscore +pexpire +zcard +zrem +cluster|slots +cluster|info +cluster|myid"

// TestPingCluster: on a cluster, Ping runs the script on every master, on a
// probe key each master serves, as docs/redis.md's cluster user.
func TestPingCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var args []any
	for _, f := range strings.Fields(clusterACL) {
		args = append(args, f)
	}
	for i := range 3 {
		if err := cl.Master(i).Client().Do(ctx, args...).Err(); err != nil {
			t.Fatalf("master %d: %s: %v", i, clusterACL, err)
		}
	}
	client := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cl.Addrs(), Username: "sluice", Password: "s3cret"})
	defer client.Close()
	lim := redisbackend.New(redisbackend.Options{Client: client, Timeout: time.Second})
	defer lim.Close()
	if err := lim.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	// A decision over 12 buckets (on several masters), as that user.
	hits := make([]bucket.Hit, 12)
	for i := range hits {
		hits[i] = bucket.Hit{Key: bucket.Key{byte(i), 1}, Limit: slow, Cost: 1}
	}
	if d, err := lim.Hit(ctx, hits, make([]bucket.State, len(hits))); !d.Allowed || err != nil {
		t.Fatalf("Hit of 12 buckets as the cluster ACL user: %v, %v", d.Allowed, err)
	}
	// Each master ran the script.
	for i := range 3 {
		stats, err := cl.Master(i).Client().Info(ctx, "commandstats").Result()
		if err != nil || !strings.Contains(stats, "cmdstat_eval") {
			t.Errorf("master %d ran no EVAL or EVALSHA (%v):\n%s", i, err, stats)
		}
	}
	if err := cl.Master(2).Client().ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	if err := lim.Ping(ctx); redisbackend.ErrorKind(err) != redisbackend.KindOOM {
		t.Errorf("Ping with one master out of memory = %v, want kind oom", err)
	}
}
