package redis

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/bucket"
)

// The probe's bucket: the probe takes one token of probeTokens refilled
// within probePeriod, so its take is always allowed and always written, and
// the key expires within milliseconds.
const (
	probePeriod = time.Second
	probeTokens = 1000
)

// probeTag starts the 16 bytes of every probe bucket's hash: the hash tag
// of a probe key reads "sluice-probe" in hex, then a 4-byte number that
// picks its cluster slot.
const probeTag = "sluice-probe"

// ping is Limiter.Ping, through client, for buckets laid out as ks, with
// sha the SHA-1 of token_bucket.lua.
//
// The probe waits for Redis until ctx's deadline: the client's read and
// write timeouts (ParseURL's backstop, 100 ms for a 10 ms --redis-timeout)
// would cut it short, and a probe that is to tell a stalled Redis from a
// starved CPU must be more patient than decisions. So it runs on a copy of
// the client (WithTimeout, the same connection pool) with timeouts as long
// as ctx's deadline leaves.
func ping(ctx context.Context, client goredis.UniversalClient, ks keyspace, sha string) error {
	patient := func(c *goredis.Client) *goredis.Client { return c }
	if deadline, ok := ctx.Deadline(); ok {
		if d := time.Until(deadline); d > 0 {
			patient = func(c *goredis.Client) *goredis.Client { return c.WithTimeout(d) }
		}
	}
	c, ok := client.(*goredis.ClusterClient)
	if !ok {
		if single, ok := client.(*goredis.Client); ok {
			client = patient(single)
		}
		return probeScript(ctx, client, sha, probeKey(ks, 0))
	}
	return c.ForEachMaster(ctx, func(ctx context.Context, m *goredis.Client) error {
		m = patient(m)
		addr := m.Options().Addr
		info, err := m.ClusterInfo(ctx).Result()
		if err != nil {
			return classify(ctx, "probe "+addr, err)
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return fmt.Errorf("backend/redis: probe %s: cluster_state is not ok: %w", addr, ErrConnection)
		}
		key, err := probeKeyOf(ctx, ks, m)
		if err != nil {
			return err
		}
		return probeScript(ctx, m, sha, key)
	})
}

// probeKey returns the key of probe bucket n.
func probeKey(ks keyspace, n uint32) string {
	var k bucket.Key
	copy(k[:], probeTag)
	binary.BigEndian.PutUint32(k[len(probeTag):], n)
	return string(ks.appendKey(nil, k))
}

// probeKeyOf returns a probe key in a slot that cluster master m serves,
// as m itself reports its slots.
func probeKeyOf(ctx context.Context, ks keyspace, m *goredis.Client) (string, error) {
	addr := m.Options().Addr
	id, err := m.ClusterMyID(ctx).Result()
	if err != nil {
		return "", classify(ctx, "probe "+addr, err)
	}
	slots, err := m.ClusterSlots(ctx).Result()
	if err != nil {
		return "", classify(ctx, "probe "+addr, err)
	}
	var mine []goredis.ClusterSlot
	for _, s := range slots {
		if len(s.Nodes) > 0 && s.Nodes[0].ID == id {
			mine = append(mine, s)
		}
	}
	// A master serving a share f of the slots takes about 1/f tries; one
	// serving a single slot, 16384 on average.
	for n := range uint32(16 * slotCount) {
		key := probeKey(ks, n)
		sl := slot([]byte(ks.tag(key)))
		for _, s := range mine {
			if sl >= int(s.Start) && sl <= int(s.End) {
				return key, nil
			}
		}
	}
	return "", fmt.Errorf("backend/redis: probe %s: the master serves no slot: %w", addr, ErrConnection)
}

// probeScript runs token_bucket.lua (SHA-1 sha) on c for one take of the
// probe bucket key, loading the script when Redis lacks it, and checks the
// reply.
func probeScript(ctx context.Context, c goredis.Scripter, sha, key string) error {
	// period (µs), requests, burst, cost, flags (a take): as part.add.
	args := [argsPerKey]uint64{uint64(probePeriod / time.Microsecond), probeTokens, probeTokens, 1, 0}
	blob := appendArgs(nil, 1, args[:])
	keys := []string{key}
	cmd := c.EvalSha(ctx, sha, keys, blob)
	if err := cmd.Err(); err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
		cmd = c.Eval(ctx, tokenBucketLua, keys, blob)
	}
	if err := cmd.Err(); err != nil {
		return classify(ctx, "probe: token_bucket.lua", err)
	}
	var reply [1]keyReply
	if err := parseReply(cmd.Val(), reply[:]); err != nil {
		return fmt.Errorf("backend/redis: probe: %w", err)
	}
	if !reply[0].allowed {
		return fmt.Errorf("backend/redis: probe: the probe bucket refused its take: %w", ErrScript)
	}
	return nil
}
