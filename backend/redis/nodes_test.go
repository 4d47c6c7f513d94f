package redis_test

import (
	"context"
	"testing"
	"time"

	redisbackend "github.com/sluice-rls/sluice/backend/redis"
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
		time.Sleep(20 * time.Millisecond)
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

func TestNodesRunDeregisters(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	// A heartbeat deadline well above -race scheduling noise (by default
	// it is Every).
	n := redisbackend.NewNodes(redisbackend.NodesOptions{Client: client, ID: "gone", Every: 10 * time.Millisecond, Timeout: time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.Run(ctx, func(err error) { t.Errorf("heartbeat: %v", err) })
	}()
	deadline := time.Now().Add(5 * time.Second)
	for client.ZScore(context.Background(), "sluice:{nodes}", "gone").Err() != nil {
		if time.Now().After(deadline) {
			t.Fatal("node never registered")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done
	if err := client.ZScore(context.Background(), "sluice:{nodes}", "gone").Err(); err == nil {
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
