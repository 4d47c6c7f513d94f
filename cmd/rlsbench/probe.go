package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
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

// machineBusy returns the CPU time all CPUs spent on processes (user, nice
// and system) or lost to the hypervisor (steal), from the first line of
// /proc/stat. Interrupt time is left out: with IRQ time accounting the
// kernel charges it to no process, so loopback traffic's softirq time would
// count as other work; without it, it is in the processes' system time.
func machineBusy() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, fmt.Errorf("machine CPU: %w", err)
	}
	return parseProcStat(string(b))
}

// parseProcStat reads the busy ticks of the "cpu" line of /proc/stat.
func parseProcStat(stat string) (time.Duration, error) {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, fmt.Errorf("machine CPU: malformed /proc/stat line %q", line)
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 8} { // user nice system steal
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("machine CPU: /proc/stat field %q: %w", f[i], err)
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

// metricsSample holds sluice's fallback metrics read at one edge of the
// window.
type metricsSample struct {
	transitions float64 // ratelimit_fallback_transitions_total{to="fallback"}
	active      float64 // ratelimit_fallback_active
	seen        bool    // the server exports them (it runs a global layer that can fail)
}

// sampleMetrics scrapes a Prometheus text endpoint.
func sampleMetrics(ctx context.Context, url string) (metricsSample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return metricsSample{}, fmt.Errorf("metrics: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return metricsSample{}, fmt.Errorf("metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return metricsSample{}, fmt.Errorf("metrics: GET %s: %s", url, resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics reads the fallback series from Prometheus text format.
func parseMetrics(r io.Reader) (metricsSample, error) {
	var m metricsSample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		var dst *float64
		switch {
		case strings.HasPrefix(line, "ratelimit_fallback_transitions_total{") && strings.Contains(line, `to="fallback"`):
			dst = &m.transitions
		case strings.HasPrefix(line, "ratelimit_fallback_active "), strings.HasPrefix(line, "ratelimit_fallback_active{"):
			dst = &m.active
		default:
			continue
		}
		f := strings.Fields(line[max(strings.LastIndexByte(line, '}'), strings.IndexByte(line, ' '))+1:])
		if len(f) == 0 {
			return m, fmt.Errorf("metrics: no value in %q", line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return m, fmt.Errorf("metrics: %q: %w", line, err)
		}
		*dst += v
		m.seen = true
	}
	return m, sc.Err()
}

// probes samples the server's CPU, its metrics and Redis' counters at both
// edges of the measured window. Only one goroutine (runLoad's window)
// touches it until the run is over.
type probes struct {
	pid     int             // server process; 0: not sampled
	redis   *goredis.Client // nil: not sampled
	metrics string          // URL of the server's /metrics; "": not sampled

	cpu0, cpu1   time.Duration // server
	self0, self1 time.Duration // this process: the load generator
	busy0, busy1 time.Duration // the whole machine
	at0, at1     time.Time
	rs0, rs1     redisSample
	ms0, ms1     metricsSample
	err          error
}

// edge samples at the start (start true) or the end of the window.
func (p *probes) edge(start bool) {
	if p.err != nil {
		return
	}
	cpu, self, busy, at, rs, ms := &p.cpu1, &p.self1, &p.busy1, &p.at1, &p.rs1, &p.ms1
	if start {
		cpu, self, busy, at, rs, ms = &p.cpu0, &p.self0, &p.busy0, &p.at0, &p.rs0, &p.ms0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if p.pid > 0 {
		*at = time.Now()
		*cpu, p.err = processCPU(p.pid)
		if p.err == nil {
			*self, p.err = processCPU(os.Getpid())
		}
		if p.err == nil {
			*busy, p.err = machineBusy()
		}
	}
	if p.redis != nil && p.err == nil {
		*rs, p.err = sampleRedis(ctx, p.redis)
	}
	if p.metrics != "" && p.err == nil {
		*ms, p.err = sampleMetrics(ctx, p.metrics)
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
	var redisCPU time.Duration
	if p.redis != nil {
		redisCPU = p.rs1.cpu - p.rs0.cpu
	}
	if p.pid > 0 {
		server := p.cpu1 - p.cpu0
		r.ServerCPUMicros = perReq(float64(server) / float64(time.Microsecond))
		r.GeneratorCPUMicros = perReq(float64(p.self1-p.self0) / float64(time.Microsecond))
		// What the machine did besides the server, the generator and its
		// Redis: other tenants' work, which skews every figure of the run.
		other := (p.busy1 - p.busy0) - server - (p.self1 - p.self0) - redisCPU
		if elapsed := p.at1.Sub(p.at0).Seconds(); elapsed > 0 {
			cores := max(0, other.Seconds()/elapsed)
			r.OtherCPUCores = &cores
		}
	}
	if p.redis != nil {
		r.RedisCommands = perReq(delta(p.rs0.commands, p.rs1.commands, probeCommands))
		r.RedisScripts = perReq(delta(p.rs0.scripts, p.rs1.scripts, 0))
		if p.rs0.hasReads && p.rs1.hasReads {
			r.RedisRoundTrips = perReq(delta(p.rs0.reads, p.rs1.reads, probeCommands))
		}
		r.RedisCPUMicros = perReq(float64(p.rs1.cpu-p.rs0.cpu) / float64(time.Microsecond))
	}
	if p.metrics != "" && p.ms0.seen && p.ms1.seen {
		tr := int64(p.ms1.transitions - p.ms0.transitions)
		r.FallbackTransitions = &tr
		r.FallbackActive = p.ms0.active > 0 || p.ms1.active > 0
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
