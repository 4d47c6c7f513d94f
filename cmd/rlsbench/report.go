package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// Backend labels the report knows: noop is the baseline of every ratio;
// the goals are stated for memory and redis.
const (
	backendNoop   = "noop"
	backendMemory = "memory"
	backendRedis  = "redis"
)

// tagSameQPS labels no-op runs paced (-rate) at the QPS a Redis run of the
// same mix reached: the baseline of CPU per request at equal throughput.
// Closed-loop gRPC costs less per request the faster it runs (more calls per
// syscall and per HTTP/2 frame), so a no-op that runs twice as fast is also
// cheaper per request.
const tagSameQPS = "at the Redis QPS"

// group is every run of one (backend, mix, tag) cell.
type group struct {
	backend, mix, tag string
	runs              []output
	failed            []string
}

func (g *group) name() string {
	if g.tag == "" {
		return g.mix
	}
	return g.mix + " (" + g.tag + ")"
}

// cell is a group's medians.
type cell struct {
	runs                 int
	qps, p50, p99, okPct float64
	errors               uint64
	cpu, cmds, rtt, rcpu *float64
	other                *float64 // cores other processes used
	gen                  *float64 // the generator's CPU µs per request
	fallbacks            *int64   // switches to the Redis fallback, all runs
	fallbackActive       bool
}

// summary takes the median of each figure over the runs, separately.
func (g *group) summary() (cell, bool) {
	if len(g.runs) == 0 {
		return cell{}, false
	}
	c := cell{runs: len(g.runs)}
	pick := func(f func(o *output) float64) float64 {
		v := make([]float64, len(g.runs))
		for i := range g.runs {
			v[i] = f(&g.runs[i])
		}
		return median(v)
	}
	pickOpt := func(f func(o *output) *float64) *float64 {
		var v []float64
		for i := range g.runs {
			if p := f(&g.runs[i]); p != nil {
				v = append(v, *p)
			}
		}
		if len(v) == 0 {
			return nil
		}
		m := median(v)
		return &m
	}
	c.qps = pick(func(o *output) float64 { return o.QPS })
	c.p50 = pick(func(o *output) float64 { return o.P50 })
	c.p99 = pick(func(o *output) float64 { return o.P99 })
	c.okPct = pick(func(o *output) float64 {
		if o.Total == 0 {
			return 0
		}
		return 100 * float64(o.OK) / float64(o.Total)
	})
	for _, o := range g.runs {
		c.errors += o.Errors
	}
	c.cpu = pickOpt(func(o *output) *float64 { return o.ServerCPUMicros })
	c.cmds = pickOpt(func(o *output) *float64 { return o.RedisCommands })
	c.rtt = pickOpt(func(o *output) *float64 { return o.RedisRoundTrips })
	c.rcpu = pickOpt(func(o *output) *float64 { return o.RedisCPUMicros })
	c.other = pickOpt(func(o *output) *float64 { return o.OtherCPUCores })
	c.gen = pickOpt(func(o *output) *float64 { return o.GeneratorCPUMicros })
	for _, o := range g.runs {
		if o.FallbackTransitions != nil {
			c.fallbacks = new(*o.FallbackTransitions + deref(c.fallbacks))
		}
		c.fallbackActive = c.fallbackActive || o.FallbackActive
	}
	return c, true
}

// machineCPU is the CPU one request costs the machine: server, generator
// and Redis.
func (c *cell) machineCPU() (float64, bool) {
	if c.cpu == nil || c.gen == nil {
		return 0, false
	}
	total := *c.cpu + *c.gen
	if c.rcpu != nil {
		total += *c.rcpu
	}
	return total, total > 0
}

// cpuBoundRatio estimates the QPS ratio of c to its baseline b from CPU
// alone: on a CPU-bound machine QPS is inversely proportional to the CPU a
// request costs it. Unlike measured QPS, it barely moves when other
// processes take CPU during the runs.
func cpuBoundRatio(c, b cell) (float64, bool) {
	mc, ok1 := c.machineCPU()
	mb, ok2 := b.machineCPU()
	if !ok1 || !ok2 {
		return 0, false
	}
	return mb / mc, true
}

// median of v (the mean of the middle two for an even count); v is sorted
// in place.
func median(v []float64) float64 {
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// results are the groups of a file, in the order they first appear.
type results struct {
	groups []*group
}

// readResults reads JSON lines (blank lines and lines starting with # are
// skipped).
func readResults(r io.Reader) (*results, error) {
	res := &results{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		var o output
		if err := json.Unmarshal([]byte(text), &o); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		g := res.find(o.Backend, o.Mix, o.Tag)
		if g == nil {
			g = &group{backend: o.Backend, mix: o.Mix, tag: o.Tag}
			res.groups = append(res.groups, g)
		}
		if o.Failed != "" {
			if !slices.Contains(g.failed, o.Failed) {
				g.failed = append(g.failed, o.Failed)
			}
			continue
		}
		g.runs = append(g.runs, o)
	}
	return res, sc.Err()
}

func (r *results) find(backend, mix, tag string) *group {
	for _, g := range r.groups {
		if g.backend == backend && g.mix == mix && g.tag == tag {
			return g
		}
	}
	return nil
}

// baseline is the no-op cell a group is compared with: the no-op runs of
// its mix tagged vs when vs is set; else same mix and tag, else same mix
// untagged (the no-op answers every variant alike).
func (r *results) baseline(g *group, vs string) (cell, bool) {
	var b *group
	if vs != "" {
		b = r.find(backendNoop, g.mix, vs)
	} else if b = r.find(backendNoop, g.mix, g.tag); b == nil || len(b.runs) == 0 {
		b = r.find(backendNoop, g.mix, "")
	}
	if b == nil {
		return cell{}, false
	}
	return b.summary()
}

// printReport prints the table and the goals of the JSON lines in path
// ("-": stdin).
func printReport(path string, w io.Writer) error {
	f := os.Stdin
	if path != "-" {
		var err error
		if f, err = os.Open(path); err != nil {
			return fmt.Errorf("report: %w", err)
		}
		defer f.Close()
	}
	res, err := readResults(f)
	if err != nil {
		return fmt.Errorf("report %s: %w", path, err)
	}
	res.writeTable(w)
	fmt.Fprintln(w)
	res.writeGoals(w)
	return nil
}

// writeTable prints one row per group: medians, and ratios to the no-op.
func (r *results) writeTable(w io.Writer) {
	fmt.Fprintln(w, "| backend | mix | runs | QPS | QPS vs no-op | QPS vs no-op from CPU | p50 ms | p99 ms | p99 vs no-op | OK | errors | server CPU µs/req | CPU vs no-op | Redis cmds/req | Redis round trips/req | Redis CPU µs/req | fallbacks | other load |")
	fmt.Fprintln(w, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	var notes []string
	for _, g := range r.groups {
		c, ok := g.summary()
		if !ok {
			reason := "no run"
			if len(g.failed) > 0 {
				reason = strings.Join(g.failed, "; ")
			}
			notes = append(notes, fmt.Sprintf("%s %s: n/a, %s", g.backend, g.name(), reason))
			fmt.Fprintf(w, "| %s | %s | 0 |%s\n", g.backend, g.name(), strings.Repeat(" n/a |", 15))
			continue
		}
		b, hasBase := r.baseline(g, "")
		isBase := g.backend == backendNoop
		ratio := func(v, base float64, pct bool) string {
			switch {
			case isBase:
				return "—"
			case !hasBase || base == 0:
				return "n/a"
			case pct:
				return fmt.Sprintf("%.0f%%", 100*v/base)
			}
			return fmt.Sprintf("%.2f×", v/base)
		}
		cpuRatio := "n/a"
		if isBase {
			cpuRatio = "—"
		} else if c.cpu != nil && hasBase && b.cpu != nil && *b.cpu > 0 {
			cpuRatio = fmt.Sprintf("%.2f×", *c.cpu / *b.cpu)
		}
		fromCPU := "n/a"
		if isBase {
			fromCPU = "—"
		} else if v, ok := cpuBoundRatio(c, b); ok && hasBase {
			fromCPU = fmt.Sprintf("%.0f%%", 100*v)
		}
		fallback := "–"
		if c.fallbacks != nil {
			fallback = fmt.Sprint(*c.fallbacks)
		}
		if c.fallbackActive {
			fallback += ", active"
		}
		fmt.Fprintf(w, "| %s | %s | %d | %.0f | %s | %s | %.3f | %.3f | %s | %.1f%% | %d | %s | %s | %s | %s | %s | %s | %s |\n",
			g.backend, g.name(), c.runs, c.qps, ratio(c.qps, b.qps, true), fromCPU,
			c.p50, c.p99, ratio(c.p99, b.p99, false), c.okPct, c.errors,
			opt(c.cpu, "%.1f"), cpuRatio, opt(c.cmds, "%.3f"), opt(c.rtt, "%.3f"), opt(c.rcpu, "%.1f"), fallback, opt(c.other, "%.2f"))
	}
	for _, n := range notes {
		fmt.Fprintln(w)
		fmt.Fprintln(w, n)
	}
	if busiest := r.otherLoad(); busiest > otherLoadWarning {
		fmt.Fprintln(w)
		fmt.Fprintf(w, "Warning: other processes used up to %.2f cores during these runs (median per row). "+
			"They skew every figure, QPS and latency most; run again when the other load column reads near 0.\n", busiest)
	}
}

// otherLoadWarning is the median load from other processes, in cores, above
// which the report warns that they skewed the rows.
const otherLoadWarning = 0.1

// otherLoad is the highest median other load of any row.
func (r *results) otherLoad() float64 {
	var most float64
	for _, g := range r.groups {
		if c, ok := g.summary(); ok && c.other != nil {
			most = max(most, *c.other)
		}
	}
	return most
}

func deref(v *int64) int64 {
	if v == nil {
		return 0
	}
	return *v
}

func opt(v *float64, format string) string {
	if v == nil {
		return "–"
	}
	return fmt.Sprintf(format, *v)
}

// goal is one target of the "Speed" issue, relative to the no-op.
type goal struct {
	backend, mix, tag string
	what              string // qps, qps-cpu (estimated from CPU), p99 or cpu
	max               bool   // the ratio must stay at or under target
	target            float64
	vs                string // tag of the no-op runs compared with ("": the usual baseline)
}

// goals are the targets of the "Speed" issue. The hot key is held to its
// target both while it has tokens and while it is over limit.
var goals = []goal{
	{backendRedis, mixEnvoy, "", "qps", false, 0.75, ""},
	{backendRedis, mixEnvoy, "", "qps-cpu", false, 0.75, ""},
	{backendRedis, mixEnvoy, "", "p99", true, 1.5, ""},
	{backendRedis, mixHot, "", "qps", false, 0.90, ""},
	{backendRedis, mixHot, "", "qps-cpu", false, 0.90, ""},
	{backendRedis, mixHot, "over-limit", "qps", false, 0.90, ""},
	{backendRedis, mixHot, "over-limit", "qps-cpu", false, 0.90, ""},
	{backendMemory, mixEnvoy, "", "qps", false, 0.85, ""},
	{backendMemory, mixEnvoy, "", "qps-cpu", false, 0.85, ""},
	{backendRedis, mixSpread, "", "cpu", true, 1.5, ""},
	{backendRedis, mixHot, "", "cpu", true, 1.5, ""},
	{backendRedis, mixHot, "over-limit", "cpu", true, 1.5, ""},
	{backendRedis, mixEnvoy, "", "cpu", true, 1.5, ""},
	{backendRedis, mixSpread, "", "cpu", true, 1.5, tagSameQPS},
	{backendRedis, mixHot, "", "cpu", true, 1.5, tagSameQPS},
	{backendRedis, mixEnvoy, "", "cpu", true, 1.5, tagSameQPS},
}

// writeGoals prints each goal with the measured ratio, or pending when its
// row or its baseline was not measured.
func (r *results) writeGoals(w io.Writer) {
	fmt.Fprintln(w, "| goal | target | measured | met |")
	fmt.Fprintln(w, "|---|--:|--:|:-:|")
	for _, gl := range goals {
		label := map[string]string{"qps": "QPS vs no-op", "qps-cpu": "QPS vs no-op from CPU", "p99": "p99 vs no-op",
			"cpu": "server CPU/request vs no-op"}[gl.what]
		if gl.vs == tagSameQPS {
			label += " at the same QPS"
		}
		name := gl.mix
		if gl.tag != "" {
			name += " (" + gl.tag + ")"
		}
		target := fmt.Sprintf("≥ %.0f%%", 100*gl.target)
		if gl.max {
			target = fmt.Sprintf("≤ %.2g×", gl.target)
		}
		measured, met := "pending", "pending"
		if v, ok := r.ratio(gl); ok {
			if gl.max {
				measured = fmt.Sprintf("%.2f×", v)
			} else {
				measured = fmt.Sprintf("%.0f%%", 100*v)
			}
			met = "no"
			if (gl.max && v <= gl.target) || (!gl.max && v >= gl.target) {
				met = "yes"
			}
		}
		fmt.Fprintf(w, "| %s, %s: %s | %s | %s | %s |\n", gl.backend, name, label, target, measured, met)
	}
}

// ratio is the goal's figure over the no-op's, if both were measured.
func (r *results) ratio(gl goal) (float64, bool) {
	g := r.find(gl.backend, gl.mix, gl.tag)
	if g == nil {
		return 0, false
	}
	c, ok := g.summary()
	if !ok {
		return 0, false
	}
	b, ok := r.baseline(g, gl.vs)
	if !ok {
		return 0, false
	}
	var v, base float64
	switch gl.what {
	case "qps-cpu":
		return cpuBoundRatio(c, b)
	case "qps":
		v, base = c.qps, b.qps
	case "p99":
		v, base = c.p99, b.p99
	case "cpu":
		if c.cpu == nil || b.cpu == nil {
			return 0, false
		}
		v, base = *c.cpu, *b.cpu
	}
	if base == 0 {
		return 0, false
	}
	return v / base, true
}
