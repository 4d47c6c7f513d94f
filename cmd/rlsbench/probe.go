package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// userHZ is the unit of utime and stime in /proc/<pid>/stat: USER_HZ, 100
// on every Linux architecture Go supports.
const userHZ = 100

// processCPU returns the user+system CPU time pid has used, from
// /proc/<pid>/stat (all threads, 10ms resolution).
func processCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("server CPU: %w", err)
	}
	return parseStatCPU(string(b))
}

// parseStatCPU reads utime and stime (fields 14 and 15) of a
// /proc/<pid>/stat line. The command name (field 2) may hold spaces and
// parentheses, so fields are counted from its last ')'.
func parseStatCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("server CPU: malformed stat %q", stat)
	}
	f := strings.Fields(stat[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0, fmt.Errorf("server CPU: stat has %d fields after the name, want ≥ 13", len(f))
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("server CPU: stat field %q: %w", s, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// redisSample holds the Redis counters read at one edge of the window.
type redisSample struct {
	commands uint64        // total_commands_processed
	scripts  uint64        // calls of EVALSHA and EVAL
	reads    uint64        // total_reads_processed: socket reads, one per batch a client sends
	hasReads bool          // Redis < 6.2 lacks total_reads_processed
	cpu      time.Duration // used_cpu_user + used_cpu_sys
}

// probeCommands is how many commands a redisSample issues; the next
// sample's counters include them.
const probeCommands = 3

// sampleRedis reads INFO stats, commandstats and cpu.
func sampleRedis(ctx context.Context, c *goredis.Client) (redisSample, error) {
	var s redisSample
	for _, section := range []string{"stats", "commandstats", "cpu"} {
		text, err := c.Info(ctx, section).Result()
		if err != nil {
			return s, fmt.Errorf("redis INFO %s: %w", section, err)
		}
		if err := s.parse(text); err != nil {
			return s, fmt.Errorf("redis INFO %s: %w", section, err)
		}
	}
	return s, nil
}

// parse adds the fields of one INFO reply to s.
func (s *redisSample) parse(info string) error {
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok {
			continue
		}
		var err error
		switch k {
		case "total_commands_processed":
			s.commands, err = strconv.ParseUint(v, 10, 64)
		case "total_reads_processed":
			s.reads, err = strconv.ParseUint(v, 10, 64)
			s.hasReads = err == nil
		case "cmdstat_evalsha", "cmdstat_eval":
			var n uint64
			n, err = commandCalls(v)
			s.scripts += n
		case "used_cpu_user", "used_cpu_sys":
			var sec float64
			sec, err = strconv.ParseFloat(v, 64)
			s.cpu += time.Duration(sec * float64(time.Second))
		}
		if err != nil {
			return fmt.Errorf("%s: %w", k, err)
		}
	}
	return sc.Err()
}

// commandCalls reads calls=N from a commandstats value such as
// "calls=12,usec=30,usec_per_call=2.50,...".
func commandCalls(v string) (uint64, error) {
	for _, kv := range strings.Split(v, ",") {
		if n, ok := strings.CutPrefix(kv, "calls="); ok {
			return strconv.ParseUint(n, 10, 64)
		}
	}
	return 0, fmt.Errorf("no calls= in %q", v)
}

// probes samples the server's CPU and Redis' counters at both edges of the
// measured window. Only one goroutine (runLoad's window) touches it until
// the run is over.
type probes struct {
	pid   int             // server process; 0: not sampled
	redis *goredis.Client // nil: not sampled

	cpu0, cpu1 time.Duration
	rs0, rs1   redisSample
	err        error
}

// edge samples at the start (start true) or the end of the window.
func (p *probes) edge(start bool) {
	if p.err != nil {
		return
	}
	cpu, rs := &p.cpu1, &p.rs1
	if start {
		cpu, rs = &p.cpu0, &p.rs0
	}
	if p.pid > 0 {
		*cpu, p.err = processCPU(p.pid)
	}
	if p.redis != nil && p.err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		*rs, p.err = sampleRedis(ctx, p.redis)
	}
}

// fill writes the per-request figures into r; calls is the number of calls
// measured in the window.
func (p *probes) fill(r *output, calls uint64) error {
	if p.err != nil {
		return p.err
	}
	if calls == 0 {
		return nil
	}
	perReq := func(v float64) *float64 { x := v / float64(calls); return &x }
	if p.pid > 0 {
		r.ServerCPUMicros = perReq(float64(p.cpu1-p.cpu0) / float64(time.Microsecond))
	}
	if p.redis != nil {
		r.RedisCommands = perReq(delta(p.rs0.commands, p.rs1.commands, probeCommands))
		r.RedisScripts = perReq(delta(p.rs0.scripts, p.rs1.scripts, 0))
		if p.rs0.hasReads && p.rs1.hasReads {
			r.RedisRoundTrips = perReq(delta(p.rs0.reads, p.rs1.reads, probeCommands))
		}
		r.RedisCPUMicros = perReq(float64(p.rs1.cpu-p.rs0.cpu) / float64(time.Microsecond))
	}
	return nil
}

// delta is b - a - own, never below 0 (counters reset by a Redis restart).
func delta(a, b, own uint64) float64 {
	if b < a+own {
		return 0
	}
	return float64(b - a - own)
}
