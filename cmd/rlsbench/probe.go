package main

import (
	"context"
	"os"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

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
