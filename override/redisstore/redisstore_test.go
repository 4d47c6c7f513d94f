package redisstore_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/sluice-rls/sluice/audit"
	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/internal/audittest"
	"github.com/sluice-rls/sluice/internal/redistest"
	"github.com/sluice-rls/sluice/override"
	"github.com/sluice-rls/sluice/override/redisstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newClient(t *testing.T, srv *redistest.Server) goredis.UniversalClient {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), MaxRetries: -1, DialTimeout: 200 * time.Millisecond, ReadTimeout: time.Second})
	t.Cleanup(func() { c.Close() })
	return c
}

func rules(t *testing.T) *descriptors.Config {
	t.Helper()
	f, err := descriptors.Parse("r.yaml", []byte("domain: edge\ndescriptors:\n  - key: user_id\n    rate_limit: {unit: second, requests_per_unit: 10}\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := descriptors.New([]*descriptors.File{f}, descriptors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestPutListDelete(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	s := redisstore.New(redisstore.Options{Client: newClient(t, srv)})
	o := override.Override{Domain: "edge", Kind: override.KindScale, Factor: 2, Reason: "r", Author: "a"}
	o.ID = override.NewID(o)
	if err := s.Put(ctx, o); err != nil {
		t.Fatalf("Put: %v", err)
	}
	got, err := s.List(ctx)
	if err != nil || len(got.Overrides) != 1 || got.Overrides[0] != o {
		t.Fatalf("List() = %v, %v; want [%v]", got, err, o)
	}
	if ok, err := s.Delete(ctx, o.ID); !ok || err != nil {
		t.Errorf("Delete(%s) = %v, %v; want true", o.ID, ok, err)
	}
	if ok, err := s.Delete(ctx, o.ID); ok || err != nil {
		t.Errorf("second Delete(%s) = %v, %v; want false, nil", o.ID, ok, err)
	}
}

// TestMalformedFieldFreezesNothing: fields that are not overrides (bad
// JSON, another ID, an invalid override) are skipped and listed as
// malformed, never fail the read: a new node applies the valid
// overrides, set and rm of others work, and rm removes the bad field
// (on main one bad field made every set and rm fail and a new node apply
// nothing).
func TestMalformedFieldFreezesNothing(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	cfg := rules(t)
	good := override.Override{Domain: "edge", Value: "user_id=worm", Kind: override.KindBlock, Reason: "r", Author: "a"}
	good.ID = override.NewID(good)
	v, _ := json.Marshal(good)
	invalid, _ := json.Marshal(override.Override{ID: "c0ffee", Kind: "pause", Reason: "r"})
	if err := srv.Client().HSet(ctx, redisstore.DefaultKey, good.ID, v, "x", "{nope", "other", v, "c0ffee", invalid).Err(); err != nil {
		t.Fatal(err)
	}
	s := redisstore.New(redisstore.Options{Client: newClient(t, srv)})
	l, err := s.List(ctx)
	if err != nil || len(l.Overrides) != 2 || len(l.Malformed) != 2 || l.Malformed[0].ID != "other" || l.Malformed[1].ID != "x" {
		t.Fatalf("List() = %+v, %v; want 2 decoded, other and x malformed", l, err)
	}
	m := override.NewManager(override.ManagerOptions{Store: s, Rules: func() *descriptors.Config { return cfg }, Resync: time.Hour})
	if err := m.Load(ctx); err != nil {
		t.Fatalf("Load: %v", err)
	}
	if tbl := m.Table(cfg); tbl == nil || len(tbl.Active()) != 1 || tbl.Active()[0].ID != good.ID {
		t.Fatalf("a new node applies %v, want the valid block only", tbl.Active())
	}
	var ids []string
	for _, b := range m.Malformed() {
		ids = append(ids, b.ID)
	}
	if strings.Join(ids, " ") != "c0ffee other x" {
		t.Errorf("Malformed() = %v, want c0ffee other x", m.Malformed())
	}
	set, err := m.Set(ctx, override.Override{Domain: "edge", Kind: override.KindScale, Factor: 0.5, Reason: "drill"}, "alice")
	if err != nil {
		t.Fatalf("Set beside malformed fields: %v", err)
	}
	if _, err := m.Remove(ctx, set.ID, "alice", "done"); err != nil {
		t.Fatalf("Remove beside malformed fields: %v", err)
	}
	for _, id := range []string{"x", "other", "c0ffee"} {
		if _, err := m.Remove(ctx, id, "alice", "cleanup"); err != nil {
			t.Errorf("Remove(%s) of a malformed field: %v", id, err)
		}
	}
	if n := srv.Client().HLen(ctx, redisstore.DefaultKey).Val(); n != 2 {
		t.Errorf("the hash holds %d fields after the cleanup, want 2 (the block, the generation)", n)
	}
	if len(m.Malformed()) != 0 {
		t.Errorf("Malformed() = %v after the cleanup, want none", m.Malformed())
	}
}

// TestManagersPropagateByNotification: an override set through one
// Manager is applied by another on the same Redis through pub/sub alone
// (its re-read interval is an hour).
func TestManagersPropagateByNotification(t *testing.T) {
	srv := redistest.Start(t)
	cfg := rules(t)
	newMgr := func() *override.Manager {
		return override.NewManager(override.ManagerOptions{
			Store: redisstore.New(redisstore.Options{Client: newClient(t, srv)}), Rules: func() *descriptors.Config { return cfg },
			Resync: time.Hour,
		})
	}
	a, b := newMgr(), newMgr()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); b.Run(ctx) }()
	defer func() { cancel(); <-done }()
	// Wait until b's subscription is up: PUBSUB NUMSUB counts it.
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, err := srv.Client().PubSubNumSub(ctx, redisstore.DefaultKey+":changed").Result()
		if err == nil && n[redisstore.DefaultKey+":changed"] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b never subscribed: %v %v", n, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	set, err := a.Set(ctx, override.Override{Domain: "edge", Rule: "edge.user_id", Kind: override.KindScale, Factor: 2, Reason: "promo", Expires: time.Now().Add(time.Hour)}, "alice")
	if err != nil {
		t.Fatalf("Set: %v", err)
	}
	for b.Table(cfg) == nil {
		if time.Now().After(deadline) {
			t.Fatal("b never applied the override")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := b.List(); len(got) != 1 || got[0].ID != set.ID || got[0].Author != "alice" {
		t.Errorf("b.List() = %v, want the override alice set", got)
	}
	if _, err := a.Remove(ctx, set.ID, "bob", "promo over"); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	for b.Table(cfg) != nil {
		if time.Now().After(deadline) {
			t.Fatal("b never dropped the removed override")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestManagerKeepsLastOverridesWhileRedisIsDown: with Redis gone the
// Manager reports the store unhealthy and keeps applying what it read.
func TestManagerKeepsLastOverridesWhileRedisIsDown(t *testing.T) {
	srv := redistest.Start(t)
	cfg := rules(t)
	m := override.NewManager(override.ManagerOptions{
		Store: redisstore.New(redisstore.Options{Client: newClient(t, srv)}), Rules: func() *descriptors.Config { return cfg },
		Timeout: 300 * time.Millisecond,
	})
	ctx := context.Background()
	if _, err := m.Set(ctx, override.Override{Domain: "edge", Kind: override.KindShadow, Reason: "drill", Expires: time.Now().Add(time.Hour)}, "alice"); err != nil {
		t.Fatalf("Set: %v", err)
	}
	srv.Kill()
	if err := m.Load(ctx); err == nil {
		t.Fatal("Load with Redis gone: no error")
	}
	if ok, _, err := m.Health(); ok || err == nil {
		t.Errorf("Health() = %v, %v; want unhealthy with the error", ok, err)
	}
	if m.Table(cfg) == nil || len(m.List()) != 1 {
		t.Errorf("with Redis gone the override is no longer applied: %v", m.List())
	}
}

// TestManagerRereadsWithoutNotification: an override written to the hash
// without its announcement (a notice lost) is applied at the next re-read,
// within the 1 s bound.
func TestManagerRereadsWithoutNotification(t *testing.T) {
	srv := redistest.Start(t)
	cfg := rules(t)
	m := override.NewManager(override.ManagerOptions{
		Store: redisstore.New(redisstore.Options{Client: newClient(t, srv)}), Rules: func() *descriptors.Config { return cfg },
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }()
	defer func() { cancel(); <-done }()
	o := override.Override{Domain: "edge", Kind: override.KindShadow, Reason: "r", Author: "a", Expires: time.Now().Add(time.Hour)}
	o.ID = override.NewID(o)
	v, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := srv.Client().HSet(ctx, redisstore.DefaultKey, o.ID, v).Err(); err != nil {
		t.Fatal(err)
	}
	for m.Table(cfg) == nil {
		if time.Since(start) > 3*time.Second {
			t.Fatal("never applied without a notification")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("applied after %v without a notification, want ≤ 1 s (resync %v)", d, override.DefaultResync)
	}
}

// TestOverridesSurviveRedisLoss: after FLUSHALL, and after a real restart
// of a redis-server without persistence, the nodes' overrides are applied
// still and written back to Redis by one node, with an override.restore
// audit event and a log line; an operator's removal of every override is
// not mistaken for a loss; and a node holding a stale table (it missed a
// removal) does not resurrect the removed override over a newer one. (On
// main the overrides were gone from Redis and from every node's table.)
func TestOverridesSurviveRedisLoss(t *testing.T) {
	srv := redistest.Start(t)
	cfg := rules(t)
	ctx := context.Background()
	var logs [2]lockedBuffer
	recs := [2]*audittest.Recorder{{}, {}}
	var mgrs [2]*override.Manager
	for i := range mgrs {
		mgrs[i] = override.NewManager(override.ManagerOptions{
			Store: redisstore.New(redisstore.Options{Client: newClient(t, srv)}), Rules: func() *descriptors.Config { return cfg },
			Resync: time.Hour, Audit: recs[i], Logger: slog.New(slog.NewTextHandler(&logs[i], nil)), Node: fmt.Sprint("n", i),
		})
	}
	a, b := mgrs[0], mgrs[1]
	block, err := a.Set(ctx, override.Override{Domain: "edge", Value: "user_id=worm", Kind: override.KindBlock, Reason: "leaked key"}, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Set(ctx, override.Override{Domain: "edge", Kind: override.KindScale, Factor: 0.5, Reason: "drill"}, "alice"); err != nil {
		t.Fatal(err)
	}
	if err := b.Load(ctx); err != nil || len(b.List()) != 2 {
		t.Fatalf("b applies %v (%v), want both overrides", b.List(), err)
	}
	stored := func() int {
		l, err := redisstore.New(redisstore.Options{Client: newClient(t, srv)}).List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return len(l.Overrides)
	}
	restores := func() int {
		n := 0
		for _, r := range recs {
			for _, e := range r.Events() {
				if e.Kind == audit.KindOverrideRestore {
					n++
				}
			}
		}
		return n
	}
	for round, lose := range []func(){
		func() {
			if err := srv.Client().FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		},
		srv.Restart,
	} {
		before := restores()
		lose()
		if n := stored(); n != 0 {
			t.Fatalf("round %d: Redis still holds %d overrides after the loss", round, n)
		}
		// Both nodes read the lost store at once; one restores, the other
		// adopts what it wrote.
		var wg sync.WaitGroup
		for _, m := range mgrs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := m.Load(ctx); err != nil {
					t.Errorf("round %d: Load after the loss: %v", round, err)
				}
			}()
		}
		wg.Wait()
		for i, m := range mgrs {
			if got := len(m.List()); got != 2 {
				t.Errorf("round %d: node %d applies %d overrides after the loss, want 2", round, i, got)
			}
		}
		if n := stored(); n != 2 {
			t.Errorf("round %d: Redis holds %d overrides after the restore, want 2", round, n)
		}
		if got := restores() - before; got != 1 {
			t.Errorf("round %d: %d override.restore events, want 1 (one node restores)", round, got)
		}
	}
	if !strings.Contains(logs[0].String()+logs[1].String(), "override store lost its overrides") {
		t.Errorf("no restore log line:\n%s\n%s", logs[0].String(), logs[1].String())
	}

	// A deliberate removal of everything is not a loss.
	for _, o := range a.List() {
		if _, err := a.Remove(ctx, o.ID, "alice", "all done"); err != nil {
			t.Fatal(err)
		}
	}
	before := restores()
	for _, m := range mgrs {
		if err := m.Load(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n, r := stored(), restores()-before; n != 0 || r != 0 || len(b.List()) != 0 {
		t.Errorf("after rm of every override: %d stored, %d restores, b applies %v; want nothing", n, r, b.List())
	}

	// A stale node: c read the block, then was cut off while it was
	// removed (by a); after a flush, c restoring first must not win.
	c := override.NewManager(override.ManagerOptions{
		Store: redisstore.New(redisstore.Options{Client: newClient(t, srv)}), Rules: func() *descriptors.Config { return cfg }, Resync: time.Hour,
	})
	block, err = a.Set(ctx, override.Override{Domain: "edge", Value: "user_id=worm", Kind: override.KindBlock, Reason: "leaked again"}, "alice")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Load(ctx); err != nil || len(c.List()) != 1 {
		t.Fatalf("c applies %v (%v), want the block", c.List(), err)
	}
	if _, err := a.Remove(ctx, block.ID, "alice", "key revoked"); err != nil { // c does not read it
		t.Fatal(err)
	}
	if err := srv.Client().FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Load(ctx); err != nil || len(c.List()) != 1 {
		t.Fatalf("stale c after the flush applies %v (%v); want its (stale) block, restored", c.List(), err)
	}
	for _, m := range []*override.Manager{a, c} {
		if err := m.Load(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n := stored(); n != 0 || len(a.List()) != 0 || len(c.List()) != 0 {
		t.Errorf("after a (newer) read: %d stored, a applies %v, c applies %v; want the removed block gone everywhere", n, a.List(), c.List())
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
