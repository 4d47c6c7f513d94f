package redistest_test

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/internal/redistest"
)

func TestStartKillRestart(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	c := s.Client()
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	if got, err := c.ConfigGet(ctx, "save").Result(); err != nil || got["save"] != "" {
		t.Errorf("CONFIG GET save = %v, %v; want \"\" (no persistence)", got, err)
	}
	pid := s.PID()
	s.Kill()
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("process %d after Kill: kill -0 = %v, want ESRCH", pid, err)
	}
	if err := c.Ping(ctx).Err(); err == nil {
		t.Errorf("PING after Kill: no error, want one")
	}
	port := s.Port()
	s.Restart()
	if s.Port() != port {
		t.Errorf("port after Restart = %d, want %d", s.Port(), port)
	}
	if got, err := c.Get(ctx, "k").Result(); !errors.Is(err, goredis.Nil) {
		t.Errorf("GET k after Restart = %q, %v; want nil (nothing persisted)", got, err)
	}
}

func TestStallResume(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	c := goredis.NewClient(&goredis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer c.Close()
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	s.Stall()
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	err := c.Ping(cctx).Err()
	cancel()
	if err == nil {
		t.Fatalf("PING on a stalled server: no error, want a timeout")
	}
	s.Resume()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Errorf("PING after Resume: %v", err)
	}
}

func TestCleanupKills(t *testing.T) {
	t.Parallel()
	var pid int
	t.Run("owner", func(t *testing.T) {
		s := redistest.Start(t)
		s.Stall() // a stalled server must die too
		pid = s.PID()
	})
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("process %d after its test ended: kill -0 = %v, want ESRCH", pid, err)
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("cluster start takes seconds")
	}
	c := redistest.StartCluster(t, 3)
	cc := c.Client()
	ctx := context.Background()
	masters := map[int]bool{}
	for _, k := range []string{"{a}", "{b}", "{c}", "{d}", "{e}", "{f}", "{g}", "{h}"} {
		if err := cc.Set(ctx, k, "v", time.Minute).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
		slot, err := cc.ClusterKeySlot(ctx, k).Result()
		if err != nil {
			t.Fatalf("CLUSTER KEYSLOT %s: %v", k, err)
		}
		masters[c.MasterOfSlot(int(slot))] = true
	}
	if len(masters) < 2 {
		t.Errorf("8 keys landed on %d masters, want several", len(masters))
	}
	// MigrateSlot moves a slot's keys with it; the client follows.
	slot, err := cc.ClusterKeySlot(ctx, "{a}").Result()
	if err != nil {
		t.Fatalf("CLUSTER KEYSLOT: %v", err)
	}
	from := c.MasterOfSlot(int(slot))
	to := (from + 1) % 3
	c.MigrateSlot(int(slot), to)
	if got := c.MasterOfSlot(int(slot)); got != to {
		t.Errorf("slot %d on master %d after MigrateSlot, want %d", slot, got, to)
	}
	if v, err := c.Master(to).Client().Get(ctx, "{a}").Result(); err != nil || v != "v" {
		t.Errorf("GET {a} on the new master: %q, %v; want v", v, err)
	}
	if v, err := cc.Get(ctx, "{a}").Result(); err != nil || v != "v" {
		t.Errorf("GET {a} through the cluster client: %q, %v; want v", v, err)
	}
	c.Master(1).Kill()
	c.Master(1).Restart()
	c.WaitOK()
}
