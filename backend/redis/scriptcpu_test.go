package redis

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/internal/redistest"
)

// TestScriptCPU measures token_bucket.lua's Redis CPU per bucket: Redis'
// own time in EVALSHA (INFO commandstats usec, which covers the script's
// GETs and SETs) divided by the buckets the calls carried. It is a
// measurement, not a check, so it runs only when SLUICE_SCRIPT_CPU is set
// (to the number of rounds; 8 when not a number):
//
//	git show main:backend/redis/token_bucket.lua > /tmp/old.lua
//	SLUICE_SCRIPT_CPU=12 SLUICE_SCRIPT_CPU_OLD=/tmp/old.lua \
//	  go test -run TestScriptCPU -v ./backend/redis/
//
// With SLUICE_SCRIPT_CPU_OLD, that version of the script (same arguments
// and reply) runs too, alternating with this one round by round (ABBA) on
// the same redis-server, so that a busy machine slows both alike: only
// such interleaved ratios are meaningful on a shared machine. Each round
// sends scriptCPUCalls calls of one shape, pipelined scriptCPUPipe at a
// time from one connection. The shapes:
//
//	spread  12 decisions × 3 keys, 36 distinct buckets per call; or 36
//	        decisions of one key each
//	shared  12 decisions × 3 keys, the first key the same in all 12
//	hot     36 decisions × 1 key, all on one bucket
//
// SLUICE_SCRIPT_CPU_SHAPE=<prefix> runs only the shapes named so. The log
// gives redis-server's PID, for `perf record -p` while the rounds run.
//
// Limits: 10 per second, a burst no call exhausts: every take is allowed
// and written, as below a limit, and buckets carry seconds of debt, so that
// they live from round to round and writes mostly keep their TTL.
func TestScriptCPU(t *testing.T) {
	env := os.Getenv("SLUICE_SCRIPT_CPU")
	if env == "" {
		t.Skip("a measurement: set SLUICE_SCRIPT_CPU=<rounds> (and SLUICE_SCRIPT_CPU_OLD=<old token_bucket.lua>) to run it")
	}
	rounds, err := strconv.Atoi(env)
	if err != nil || rounds < 1 {
		rounds = 8
	}
	scripts := []cpuScript{{"new", tokenBucketLua, scriptCPUShapes(tokenBucketCPU)}}
	if path := os.Getenv("SLUICE_SCRIPT_CPU_OLD"); path != "" {
		old, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		scripts = append([]cpuScript{{"old", string(old), scripts[0].shapes}}, scripts...)
	}
	runScriptCPU(t, rounds, scripts)
}

// TestLeaseScriptCPU measures lease.lua's Redis CPU per op as
// TestScriptCPU measures token_bucket.lua's, beside token_bucket.lua on the
// same shapes in alternating rounds (ABBA): one-key takes of 1 token, every
// op allowed, the exact layer's op against the leased layer's op that
// Redis decides (a take leasing nothing: a key's first decision, or one
// near its limit; and the same take leasing up to 10 more). It runs when
// SLUICE_SCRIPT_CPU is set, as TestScriptCPU; every ratio is to the first
// script, token_bucket.lua.
//
// With SLUICE_LEASE_CPU_OLD naming another lease.lua (same arguments and
// reply), it measures that one against this one instead, alternating
// round by round (ABBA) on the calls of leaseCPUShapes:
//
//	git show main:backend/redis/lease.lua > /tmp/old.lua
//	SLUICE_SCRIPT_CPU=12 SLUICE_LEASE_CPU_OLD=/tmp/old.lua \
//	  go test -run TestLeaseScriptCPU -v ./backend/redis/
func TestLeaseScriptCPU(t *testing.T) {
	env := os.Getenv("SLUICE_SCRIPT_CPU")
	if env == "" {
		t.Skip("a measurement: set SLUICE_SCRIPT_CPU=<rounds> (and SLUICE_LEASE_CPU_OLD=<old lease.lua>) to run it")
	}
	rounds, err := strconv.Atoi(env)
	if err != nil || rounds < 1 {
		rounds = 8
	}
	scripts := []cpuScript{
		{"token_bucket", tokenBucketLua, scriptCPUShapes(tokenBucketCPU)},
		{"lease", leaseLua, scriptCPUShapes(leaseCPU(0))},
		{"lease+10", leaseLua, scriptCPUShapes(leaseCPU(10))},
	}
	if path := os.Getenv("SLUICE_LEASE_CPU_OLD"); path != "" {
		old, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		scripts = []cpuScript{{"old", string(old), leaseCPUShapes()}, {"new", leaseLua, leaseCPUShapes()}}
	}
	runScriptCPU(t, rounds, scripts)
}

// cpuScript is one script of a CPU measurement, with its calls' shapes
// (the same names and keys for every script of a run).
type cpuScript struct {
	name, src string
	shapes    []scriptCPUShape
}

// runScriptCPU runs rounds of every shape of every script, alternating the
// scripts round by round (ABBA) on one redis-server, and logs the µs per
// bucket of each and its ratio to the first script.
func runScriptCPU(t *testing.T, rounds int, scripts []cpuScript) {
	srv := redistest.Start(t)
	c := srv.Client()
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	t.Logf("redis-server pid %d", srv.PID())
	shas := make([]string, len(scripts))
	for i, s := range scripts {
		var err error
		if shas[i], err = c.ScriptLoad(ctx, s.src).Result(); err != nil {
			t.Fatalf("SCRIPT LOAD %s: %v", s.name, err)
		}
	}
	only := os.Getenv("SLUICE_SCRIPT_CPU_SHAPE")
	for n, shape := range scripts[0].shapes {
		if !strings.HasPrefix(shape.name, only) {
			continue
		}
		per := make([][]float64, len(scripts)) // µs per bucket, by script, one per round
		for r := range rounds {
			for j := range scripts {
				i := j
				if r%2 == 1 {
					i = len(scripts) - 1 - j // ABBA
				}
				us, err := scriptCPURound(ctx, c, shas[i], scripts[i].shapes[n], r*len(scripts)+j)
				if err != nil {
					t.Fatalf("%s, %s: %v", shape.name, scripts[i].name, err)
				}
				per[i] = append(per[i], us)
			}
		}
		line := shape.name + ":"
		for i, s := range scripts {
			line += fmt.Sprintf(" %s median %.2f min %.2f µs/bucket;", s.name, median(per[i]), slices.Min(per[i]))
		}
		for i := 1; i < len(scripts); i++ {
			ratios := make([]float64, rounds)
			for r := range rounds {
				ratios[r] = per[i][r] / per[0][r]
			}
			line += fmt.Sprintf(" %s/%s median %.3f (rounds: %s);", scripts[i].name, scripts[0].name, median(ratios), fmtRatios(ratios))
		}
		t.Log(line)
	}
}

// scriptCPUCalls and scriptCPUPipe are the calls of one round and how many
// go in one pipeline.
const (
	scriptCPUCalls = 2000
	scriptCPUPipe  = 16
)

// scriptCPUShape is one kind of call: its keys and ARGV[1] for call i,
// and the reply's bytes per bucket.
type scriptCPUShape struct {
	name    string
	buckets int // per call
	reply   int
	build   func(i int) (keys []string, blob []byte)
}

// cpuArgs is a script's arguments of a CPU measurement: its keys' prefix,
// a take's arguments after the decision number, and its reply's bytes per
// key.
type cpuArgs struct {
	prefix string
	take   []uint64
	reply  int
}

// tokenBucketCPU is token_bucket.lua's: a take of 1 token of 10 per
// second with a burst no call exhausts.
var tokenBucketCPU = cpuArgs{"cpu/", []uint64{uint64(time.Second / time.Microsecond), 10, 1 << 50, 1, 0}, replyBytes}

// leaseCPU is lease.lua's, the same take, leasing up to extra more (2
// nodes) for a window of 2 s.
func leaseCPU(extra uint64) cpuArgs {
	return cpuArgs{"cpu-lease/", []uint64{uint64(time.Second / time.Microsecond), 10, 1 << 50, 1, 1, extra, 4, 0, uint64(2 * time.Second / time.Microsecond), 0, 0}, leaseReplyBytes}
}

func scriptCPUShapes(a cpuArgs) []scriptCPUShape {
	const table = 4096 // spread buckets
	spread := func(i, j int) string { return a.prefix + "spread/" + strconv.Itoa((i*36+j*131)%table) }
	return []scriptCPUShape{
		{"spread 12x3", 36, a.reply, func(i int) ([]string, []byte) {
			var keys []string
			var blob []byte
			for d := range 12 {
				for k := range 3 {
					keys = append(keys, spread(i, d*3+k))
					blob = appendArgs(blob, uint64(d+1), a.take)
				}
			}
			return keys, blob
		}},
		{"spread 36x1", 36, a.reply, func(i int) ([]string, []byte) {
			var keys []string
			var blob []byte
			for d := range 36 {
				keys = append(keys, spread(i, d))
				blob = appendArgs(blob, uint64(d+1), a.take)
			}
			return keys, blob
		}},
		{"shared 12x3", 36, a.reply, func(i int) ([]string, []byte) {
			var keys []string
			var blob []byte
			for d := range 12 {
				keys = append(keys, a.prefix+"shared")
				blob = appendArgs(blob, uint64(d+1), a.take)
				for k := 1; k < 3; k++ {
					keys = append(keys, spread(i, d*3+k))
					blob = appendArgs(blob, uint64(d+1), a.take)
				}
			}
			return keys, blob
		}},
		{"hot 36x1", 36, a.reply, func(int) ([]string, []byte) {
			var keys []string
			var blob []byte
			for d := range 36 {
				keys = append(keys, a.prefix+"hot")
				blob = appendArgs(blob, uint64(d+1), a.take)
			}
			return keys, blob
		}},
	}
}

// leaseCPUShapes is lease.lua's calls by kind of op, 36 ops a call, on
// limits of 10 per second with a burst no call exhausts (every take
// allowed): takes of 1 token leasing up to 10 more (2 nodes, a window of
// 2 s) on keys no call used before, on keys of a table of 4096 that live
// from call to call (counting leases), and on one hot key, in decisions of
// one op or of 3 keys; and, one op a decision on the table's keys,
// prefetches (an independent take of nothing, leasing up to 10), returns
// of 1 token closing a pool of 11, and gives of 1 token.
func leaseCPUShapes() []scriptCPUShape {
	const table = 4096
	take := leaseCPU(10).take
	with := func(flags, take1, since, unpark uint64) []uint64 {
		a := slices.Clone(take)
		a[3], a[4], a[7], a[9], a[10] = 0, take1, flags, since, unpark
		return a
	}
	prefetch, ret, give := with(2, 0, 0, 0), with(3, 1, 1<<52, 11), with(1, 1, 0, 0)
	shape := func(name string, per int, key func(i, j int) string, args []uint64) scriptCPUShape {
		return scriptCPUShape{name, 36, leaseReplyBytes, func(i int) ([]string, []byte) {
			keys := make([]string, 0, 36)
			var blob []byte
			for j := range 36 {
				keys = append(keys, key(i, j))
				blob = appendArgs(blob, uint64(j/per+1), args)
			}
			return keys, blob
		}}
	}
	fresh := func(name string) func(i, j int) string {
		return func(i, j int) string { return "cpu-lease/" + name + "/" + strconv.Itoa(i*36+j) }
	}
	spread := func(i, j int) string { return "cpu-lease/spread/" + strconv.Itoa((i*36+j*131)%table) }
	hot := func(int, int) string { return "cpu-lease/hot" }
	return []scriptCPUShape{
		shape("new 36x1", 1, fresh("new1"), take),
		shape("new 12x3", 3, fresh("new3"), take),
		shape("spread 36x1", 1, spread, take),
		shape("spread 12x3", 3, spread, take),
		shape("hot 36x1", 1, hot, take),
		shape("prefetch 36x1", 1, spread, prefetch),
		shape("return 36x1", 1, spread, ret),
		shape("give 36x1", 1, spread, give),
	}
}

// scriptCPURound resets Redis' statistics, sends scriptCPUCalls calls of
// shape to the script sha, seeded by seed, and returns Redis' EVALSHA
// microseconds per bucket.
func scriptCPURound(ctx context.Context, c *goredis.Client, sha string, shape scriptCPUShape, seed int) (float64, error) {
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		return 0, err
	}
	for i := 0; i < scriptCPUCalls; i += scriptCPUPipe {
		pipe := c.Pipeline()
		for j := i; j < i+scriptCPUPipe; j++ {
			keys, blob := shape.build(seed*scriptCPUCalls + j)
			pipe.EvalSha(ctx, sha, keys, blob)
		}
		cmds, err := pipe.Exec(ctx)
		if err != nil {
			return 0, err
		}
		for _, cmd := range cmds {
			if s, ok := cmd.(*goredis.Cmd).Val().(string); !ok || len(s) != shape.reply*shape.buckets {
				return 0, fmt.Errorf("reply %q", cmd.(*goredis.Cmd).Val())
			}
		}
	}
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(info, "\n") {
		v, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:")
		if !ok {
			continue
		}
		var calls, usec float64
		for field := range strings.SplitSeq(v, ",") {
			k, x, _ := strings.Cut(field, "=")
			switch k {
			case "calls":
				calls, _ = strconv.ParseFloat(x, 64)
			case "usec":
				usec, _ = strconv.ParseFloat(x, 64)
			}
		}
		if calls != scriptCPUCalls {
			return 0, fmt.Errorf("INFO commandstats: %v EVALSHA calls, want %d", calls, scriptCPUCalls)
		}
		return usec / calls / float64(shape.buckets), nil
	}
	return 0, fmt.Errorf("INFO commandstats: no cmdstat_evalsha in %q", info)
}

func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

func fmtRatios(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = strconv.FormatFloat(x, 'f', 2, 64)
	}
	return strings.Join(parts, " ")
}
