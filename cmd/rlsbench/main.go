// Command rlsbench measures a rate-limit service: a closed-loop gRPC load
// generator for envoy.service.ratelimit.v3.RateLimitService, a no-op
// service that gives the machine's ceiling, and the report that turns runs
// into a markdown table. scripts/bench.sh drives all three (see
// docs/benchmarks.md).
//
//	rlsbench [-addr A[,B,...]] [-mix spread|hot|envoy] [-c 64] [-conns 4] [-d 10s] [-warmup 1s] ...
//	rlsbench -noop [-listen 127.0.0.1:0]
//	rlsbench -report FILE
//
// With several addresses (-addr a,b,c: the nodes of one fleet), the callers
// are spread over them round-robin, and the JSON line adds each address'
// answer counts.
//
// A load run prints one JSON line: throughput, latency percentiles in
// milliseconds, answer counts and, with -server-pid and -redis, the
// server's CPU time and Redis' work per request, all sampled at the edges
// of the measured window. It always ends by itself: a call still running 5s
// after the window is cancelled and counted as an error.
//
// Latency is measured per call with time.Now and recorded into a
// histogram owned by each caller (merged after the run), and every request
// is built before the clock starts, so the generator spends its CPU on
// gRPC, as the load it stands for would.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "rlsbench:", err)
		}
		stop()
		os.Exit(1)
	}
}

// settings are rlsbench's flags.
type settings struct {
	addrs     []string
	callers   int
	conns     int
	duration  time.Duration
	warmup    time.Duration
	pool      poolOptions
	backend   string
	tag       string
	serverPID int
	redisAddr string
	metrics   string

	rate float64

	noop     bool
	listen   string
	lifetime time.Duration

	report string
}

func parse(args []string, stderr io.Writer) (settings, error) {
	var s settings
	fs := flag.NewFlagSet("rlsbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8081", "gRPC address of the service under load, or a comma-separated list of its nodes' addresses: callers are spread over them round-robin (-c must be a multiple of their number)")
	fs.IntVar(&s.callers, "c", 64, "concurrent closed-loop callers")
	fs.IntVar(&s.conns, "conns", 4, "gRPC connections to each address; its callers are spread over them round-robin")
	fs.DurationVar(&s.duration, "d", 10*time.Second, "measured duration")
	fs.DurationVar(&s.warmup, "warmup", time.Second, "unmeasured warmup before the measured duration")
	fs.Float64Var(&s.rate, "rate", 0, "cap on calls per second, all callers together (0: as fast as answers come); to compare CPU per request at equal throughput")
	fs.StringVar(&s.pool.Mix, "mix", mixEnvoy, "requests: spread (1 descriptor, many addresses), hot (1 descriptor, one key) or envoy (remote_address, user_id, route+user_id)")
	fs.StringVar(&s.pool.Domain, "domain", "edge", "rate-limit domain of the requests")
	fs.IntVar(&s.pool.Keys, "keys", 1<<17, "distinct remote_address values of the spread mix")
	fs.StringVar(&s.pool.HotValue, "hot-value", "10.0.0.1", "remote_address of the hot mix")
	fs.Uint64Var(&s.pool.Seed, "seed", 1, "seed of the generated keys")
	fs.StringVar(&s.backend, "backend", "", "label copied into the JSON line (the report groups by it; \"noop\" is the baseline)")
	fs.StringVar(&s.tag, "tag", "", "label copied into the JSON line, telling variants of a mix apart")
	fs.IntVar(&s.serverPID, "server-pid", 0, "PID of the server: report its CPU time per request, and the CPU other processes used (Linux /proc)")
	fs.StringVar(&s.metrics, "metrics", "", "URL of the server's Prometheus /metrics: report its switches to the Redis fallback")
	fs.StringVar(&s.redisAddr, "redis", "", "host:port of the Redis the server uses: report its commands, round trips and CPU per request")
	fs.BoolVar(&s.noop, "noop", false, "serve a no-op RateLimitService (answers OK, does nothing) instead of generating load")
	fs.StringVar(&s.listen, "listen", "127.0.0.1:0", "with -noop: listen address")
	fs.DurationVar(&s.lifetime, "lifetime", time.Hour, "with -noop: stop after this long even if never signalled")
	fs.StringVar(&s.report, "report", "", "print the markdown table of a file of JSON lines (- for stdin) instead of generating load")
	if err := fs.Parse(args); err != nil {
		return s, err
	}
	if fs.NArg() > 0 {
		return s, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if s.addrs, err = parseAddrs(*addr); err != nil {
		return s, err
	}
	if s.callers%len(s.addrs) != 0 {
		return s, fmt.Errorf("-c %d does not spread evenly over %d addresses: use a multiple of %d", s.callers, len(s.addrs), len(s.addrs))
	}
	return s, nil
}

// parseAddrs splits -addr's comma-separated list. An empty or repeated
// entry is an error: either would skew the share of each node unnoticed.
func parseAddrs(list string) ([]string, error) {
	parts := strings.Split(list, ",")
	addrs := make([]string, 0, len(parts))
	for _, a := range parts {
		a = strings.TrimSpace(a)
		if a == "" {
			return nil, fmt.Errorf("-addr %q: empty address", list)
		}
		if slices.Contains(addrs, a) {
			return nil, fmt.Errorf("-addr %q: %s is listed twice", list, a)
		}
		addrs = append(addrs, a)
	}
	return addrs, nil
}

// run executes one rlsbench command.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	s, err := parse(args, stderr)
	if err != nil {
		return err
	}
	switch {
	case s.noop:
		return serveNoop(ctx, s.listen, s.lifetime, slog.New(slog.NewTextHandler(stderr, nil)))
	case s.report != "":
		return printReport(s.report, stdout)
	}
	return load(ctx, s, stdout)
}

// output is the JSON line of one load run. Per-request figures are absent
// when not sampled.
type output struct {
	// Backend and Tag are the -backend and -tag labels; Mix, Domain, C,
	// Conns, DurationSec and WarmupSec are the run's settings.
	Backend     string  `json:"backend,omitempty"`
	Tag         string  `json:"tag,omitempty"`
	Mix         string  `json:"mix"`
	Domain      string  `json:"domain,omitempty"`
	C           int     `json:"c"`
	Conns       int     `json:"conns"`
	DurationSec float64 `json:"duration_s"`
	WarmupSec   float64 `json:"warmup_s"`
	// Rate is the -rate cap, when set.
	Rate float64 `json:"rate,omitempty"`

	// QPS is answers per second in the measured window; P50 to Max are
	// latency percentiles in milliseconds.
	QPS  float64 `json:"qps"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
	P999 float64 `json:"p999_ms"`
	Max  float64 `json:"max_ms"`

	// Total is the calls started in the measured window: OK, OverLimit or
	// Errors (with FirstError's message). WarmupCalls were not measured.
	Total       uint64 `json:"total"`
	OK          uint64 `json:"ok"`
	OverLimit   uint64 `json:"over_limit"`
	Errors      uint64 `json:"error"`
	WarmupCalls uint64 `json:"warmup_calls"`
	FirstError  string `json:"first_error,omitempty"`

	// ServerCPUMicros is the server's CPU time per request, and
	// GeneratorCPUMicros rlsbench's own (both sampled with -server-pid).
	ServerCPUMicros    *float64 `json:"server_cpu_us_per_req,omitempty"`
	GeneratorCPUMicros *float64 `json:"generator_cpu_us_per_req,omitempty"`
	// OtherCPUCores is the CPU the rest of the machine used during the
	// window (busy time of all CPUs minus the server's, the generator's and
	// Redis'), in cores: anything above ~0.1 means other work skewed the run.
	OtherCPUCores *float64 `json:"other_cpu_cores,omitempty"`

	// RedisCommands (all commands Redis ran, those inside scripts
	// included), RedisScripts (EVALSHA and EVAL calls), RedisRoundTrips
	// (socket reads) and RedisCPUMicros are per request, sampled with -redis.
	RedisCommands   *float64 `json:"redis_cmds_per_req,omitempty"`
	RedisScripts    *float64 `json:"redis_scripts_per_req,omitempty"`
	RedisRoundTrips *float64 `json:"redis_round_trips_per_req,omitempty"`
	RedisCPUMicros  *float64 `json:"redis_cpu_us_per_req,omitempty"`

	// FallbackTransitions counts the server's switches from Redis to its
	// fallback during the window; FallbackActive is set when it was in
	// fallback at either edge. Both need -metrics and a server that exports
	// ratelimit_fallback_*.
	FallbackTransitions *int64 `json:"fallback_transitions,omitempty"`
	FallbackActive      bool   `json:"fallback_active,omitempty"`

	// Failed is set only by the benchmark script, for a run that could not
	// happen (the server did not start); the report shows it as n/a.
	Failed string `json:"failed,omitempty"`

	// Addrs are each address' answer counts, when -addr lists several
	// (last, so that the first "ok" of the line is the run's).
	Addrs []addrOutput `json:"addrs,omitempty"`
}

// addrOutput is one address' answers in the measured window.
type addrOutput struct {
	Addr      string `json:"addr"`
	Total     uint64 `json:"total"`
	OK        uint64 `json:"ok"`
	OverLimit uint64 `json:"over_limit"`
	Errors    uint64 `json:"error"`
}

// load runs the generator and prints its JSON line.
func load(ctx context.Context, s settings, stdout io.Writer) error {
	pool, err := buildPool(s.pool)
	if err != nil {
		return err
	}
	p := &probes{pid: s.serverPID, metrics: s.metrics}
	if s.redisAddr != "" {
		p.redis = goredis.NewClient(&goredis.Options{Addr: s.redisAddr, PoolSize: 1})
		defer p.redis.Close()
	}
	res, err := runLoad(ctx, loadOptions{
		Addrs:    s.addrs,
		Callers:  s.callers,
		Conns:    s.conns,
		Warmup:   s.warmup,
		Duration: s.duration,
		Pool:     pool,
		Rate:     s.rate,
		Window:   p.edge,
	})
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("interrupted: %w", err)
	}
	out := summarize(s, res)
	if err := p.fill(&out, res.total()); err != nil {
		return err
	}
	b, err := json.Marshal(out)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%s\n", b)
	return err
}

// summarize turns a run's tallies into its JSON line.
func summarize(s settings, r loadResult) output {
	ms := func(q float64) float64 { return round(float64(r.hist.quantile(q))/1e6, 3) }
	o := output{
		Backend:     s.backend,
		Tag:         s.tag,
		Mix:         s.pool.Mix,
		Domain:      s.pool.Domain,
		C:           s.callers,
		Conns:       s.conns,
		DurationSec: r.window.Seconds(),
		WarmupSec:   s.warmup.Seconds(),
		Rate:        s.rate,
		QPS:         round(float64(r.total())/r.window.Seconds(), 1),
		P50:         ms(0.50),
		P90:         ms(0.90),
		P99:         ms(0.99),
		P999:        ms(0.999),
		Max:         ms(1),
		Total:       r.total(),
		OK:          r.ok,
		OverLimit:   r.overLimit,
		Errors:      r.errors,
		WarmupCalls: r.warmup,
	}
	if r.firstError != nil {
		o.FirstError = r.firstError.Error()
	}
	if len(s.addrs) > 1 {
		for i, a := range r.perAddr {
			o.Addrs = append(o.Addrs, addrOutput{Addr: s.addrs[i], Total: a.ok + a.overLimit + a.errors, OK: a.ok, OverLimit: a.overLimit, Errors: a.errors})
		}
	}
	return o
}

// round rounds v to the given number of decimals.
func round(v float64, decimals int) float64 {
	p := math.Pow(10, float64(decimals))
	return math.Round(v*p) / p
}
