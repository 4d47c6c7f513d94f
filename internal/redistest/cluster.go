package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// clusterTimeout bounds cluster creation and each wait for a healthy cluster.
const clusterTimeout = 30 * time.Second

// Cluster is a Redis Cluster of masters without replicas, owned by a test.
// Nodes run with cluster-require-full-coverage off, so killing one master
// fails only the slots it serves.
type Cluster struct {
	t       testing.TB
	masters []*Server
}

// StartCluster starts masters (at least 3) cluster-enabled redis-servers,
// joins them with redis-cli --cluster create, and waits until every node
// reports cluster_state:ok with all 16384 slots covered.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	cli := lookBinary(t, "redis-cli")
	lookBinary(t, "redis-server")
	if masters < 3 {
		t.Fatalf("redistest: a cluster needs at least 3 masters, got %d", masters)
	}
	c := &Cluster{t: t}
	addrs := make([]string, masters)
	for i := range masters {
		s := Start(t, withPortFrom(clusterPort), WithArgs(
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "1000",
			"--cluster-require-full-coverage", "no",
		))
		c.masters = append(c.masters, s)
		addrs[i] = s.Addr()
	}

	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	c.WaitOK()
	return c
}

// clusterPort returns a free port whose cluster bus port (port + 10000) is
// free too.
func clusterPort() (int, error) {
	for range 100 {
		p, err := freePort()
		if err != nil {
			return 0, err
		}
		if p+10000 > 65535 {
			continue
		}
		if l, err := listen(p + 10000); err == nil {
			_ = l.Close()
			return p, nil
		}
	}
	return 0, fmt.Errorf("no free port pair (p, p+10000) for a cluster node")
}

// Addrs returns the masters' addresses.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.masters))
	for i, s := range c.masters {
		addrs[i] = s.Addr()
	}
	return addrs
}

// Master returns the i-th master, to Kill, Stall, Resume or Restart it.
// After a Restart, call WaitOK.
func (c *Cluster) Master(i int) *Server { return c.masters[i] }

// Client returns a new cluster client seeded with every master, closed when
// the test ends.
func (c *Cluster) Client() *goredis.ClusterClient {
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: c.Addrs()})
	c.t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// MasterOfSlot returns the index of the master serving slot, as a live node
// sees it.
func (c *Cluster) MasterOfSlot(slot int) int {
	c.t.Helper()
	for _, s := range c.masters {
		if s.PID() == 0 {
			continue
		}
		owner, err := slotOwner(s.Addr(), slot)
		if err != nil {
			continue
		}
		for i, m := range c.masters {
			if m.Port() == owner {
				return i
			}
		}
	}
	c.t.Fatalf("redistest: no live node knows the owner of slot %d", slot)
	return -1
}

func slotOwner(addr string, slot int) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	rc := goredis.NewClient(&goredis.Options{Addr: addr})
	defer rc.Close()
	ranges, err := rc.ClusterSlots(ctx).Result()
	if err != nil {
		return 0, err
	}
	for _, r := range ranges {
		if slot >= r.Start && slot <= r.End && len(r.Nodes) > 0 {
			_, port, _ := strings.Cut(r.Nodes[0].Addr, ":")
			return strconv.Atoi(port)
		}
	}
	return 0, fmt.Errorf("slot %d not served", slot)
}

// WaitOK waits until every running master reports cluster_state:ok, all
// slots assigned and ok, and knows every master.
func (c *Cluster) WaitOK() {
	c.t.Helper()
	err := waitFor(context.Background(), clusterTimeout, func(ctx context.Context) error {
		for _, s := range c.masters {
			if s.PID() == 0 {
				return fmt.Errorf("master %s is not running", s.Addr())
			}
			if err := nodeOK(ctx, s.Addr(), len(c.masters)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		c.t.Fatalf("redistest: cluster not ok within %v: %v", clusterTimeout, err)
	}
}

func nodeOK(ctx context.Context, addr string, masters int) error {
	rc := goredis.NewClient(&goredis.Options{Addr: addr})
	defer rc.Close()
	info, err := rc.ClusterInfo(ctx).Result()
	if err != nil {
		return fmt.Errorf("%s: CLUSTER INFO: %w", addr, err)
	}
	want := map[string]string{
		"cluster_state":          "ok",
		"cluster_slots_assigned": "16384",
		"cluster_slots_ok":       "16384",
		"cluster_known_nodes":    strconv.Itoa(masters),
	}
	for line := range strings.SplitSeq(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if w, ok := want[k]; ok {
			if v != w {
				return fmt.Errorf("%s: %s is %s, want %s", addr, k, v, w)
			}
			delete(want, k)
		}
	}
	if len(want) > 0 {
		return fmt.Errorf("%s: CLUSTER INFO lacks %v", addr, want)
	}
	return nil
}

// MoveSlot gives slot, which must hold no keys, to master to, as the last
// step of a resharding does, and waits until every master agrees. Clients
// keep their slot map until a MOVED reply (or a reload) updates it.
func (c *Cluster) MoveSlot(slot, to int) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	dst := c.masters[to].Client()
	id, err := dst.ClusterMyID(ctx).Result()
	if err != nil {
		c.t.Fatalf("redistest: CLUSTER MYID: %v", err)
	}
	// The new owner's epoch must be the highest for its claim to win.
	if err := dst.Do(ctx, "CLUSTER", "BUMPEPOCH").Err(); err != nil {
		c.t.Fatalf("redistest: CLUSTER BUMPEPOCH: %v", err)
	}
	order := []*Server{c.masters[to]} // the new owner first
	for i, s := range c.masters {
		if i != to {
			order = append(order, s)
		}
	}
	for _, s := range order {
		if err := s.Client().Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", id).Err(); err != nil {
			c.t.Fatalf("redistest: CLUSTER SETSLOT %d NODE on %s: %v", slot, s.Addr(), err)
		}
	}
	err = waitFor(ctx, clusterTimeout, func(context.Context) error {
		for _, s := range c.masters {
			owner, err := slotOwner(s.Addr(), slot)
			if err != nil {
				return err
			}
			if owner != c.masters[to].Port() {
				return fmt.Errorf("%s sees slot %d on port %d, want %d", s.Addr(), slot, owner, c.masters[to].Port())
			}
		}
		return nil
	})
	if err != nil {
		c.t.Fatalf("redistest: slot %d not moved within %v: %v", slot, clusterTimeout, err)
	}
}

// MigrateSlot moves slot with its keys to master to, as a resharding does:
// the new owner imports the slot, the old one migrates it (clients asking
// it for a key it no longer holds get ASK), MIGRATE moves the keys in
// batches, then MoveSlot gives the now empty slot to the new owner. Clients
// keep their slot map until a MOVED reply (or a reload) updates it.
// (redis-cli --cluster reshard picks its own slots; a test needs one.)
func (c *Cluster) MigrateSlot(slot, to int) {
	c.t.Helper()
	from := c.MasterOfSlot(slot)
	if from == to {
		c.t.Fatalf("redistest: slot %d is on master %d already", slot, to)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	src, dst := c.masters[from].Client(), c.masters[to].Client()
	srcID, err := src.ClusterMyID(ctx).Result()
	if err != nil {
		c.t.Fatalf("redistest: CLUSTER MYID: %v", err)
	}
	dstID, err := dst.ClusterMyID(ctx).Result()
	if err != nil {
		c.t.Fatalf("redistest: CLUSTER MYID: %v", err)
	}
	if err := dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err(); err != nil {
		c.t.Fatalf("redistest: CLUSTER SETSLOT %d IMPORTING: %v", slot, err)
	}
	if err := src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err(); err != nil {
		c.t.Fatalf("redistest: CLUSTER SETSLOT %d MIGRATING: %v", slot, err)
	}
	host, port := "127.0.0.1", strconv.Itoa(c.masters[to].Port())
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, 100).Result()
		if err != nil {
			c.t.Fatalf("redistest: CLUSTER GETKEYSINSLOT %d: %v", slot, err)
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := src.Do(ctx, args...).Err(); err != nil {
			c.t.Fatalf("redistest: MIGRATE %d keys of slot %d: %v", len(keys), slot, err)
		}
	}
	c.MoveSlot(slot, to)
}
