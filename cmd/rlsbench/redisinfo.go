package main

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

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

// delta is b - a - own, never below 0 (counters reset by a Redis restart).
func delta(a, b, own uint64) float64 {
	if b < a+own {
		return 0
	}
	return float64(b - a - own)
}
