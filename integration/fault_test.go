//go:build integration

package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/internal/redistest"
)

// faultRules: a busy global limit for the load, a one-token bucket for
// layer probes, and a slow bucket whose level survives only in Redis.
const faultRules = `domain: fault
descriptors:
  - key: client
    rate_limit: {unit: second, requests_per_unit: 1000, burst: 1000}
  - key: once
    rate_limit: {unit: minute, requests_per_unit: 1, burst: 1}
  - key: slow
    rate_limit: {unit: minute, requests_per_unit: 5, burst: 5}
`

const (
	faultRate  = 1000.0 // client: tokens per second
	faultBurst = 1000.0
	// faultWorkers is the closed-loop concurrency of the load.
	faultWorkers = 8
)

// Bounds on answers while Redis fails (see checkFast). Envoy gives up on
// the rate-limit call after 20ms by default, so the server's p99 must stay
// under it. recoverWithin bounds the time from Redis answering again to
// the node logging its switch back (backOnRedis).
const (
	failP99       = 20 * time.Millisecond
	recoverWithin = 2 * time.Second
)

const (
	toFallbackSeries = `ratelimit_fallback_transitions_total{to="fallback"}`
	toRedisSeries    = `ratelimit_fallback_transitions_total{to="redis"}`
	// redisCallsSeries counts the global layer's calls to Redis.
	redisCallsSeries = `ratelimit_redis_duration_seconds_count{op="hit"}`
)

// startFaultRLS runs rls on faultRules with the global layer on redisArg.
func startFaultRLS(t *testing.T, redisArg string, extra ...string) *rlsProcess {
	t.Helper()
	rules := writeFile(t, t.TempDir(), "rules.yaml", faultRules)
	p := startRLS(t, append([]string{"--redis", redisArg, "--config", rules}, extra...)...)
	t.Cleanup(func() {
		if t.Failed() || testing.Verbose() {
			t.Logf("fallback transitions logged:\n%s", transitionLines(p))
		}
	})
	return p
}

// loadOneKey drives p with faultWorkers closed-loop workers on one bucket.
func loadOneKey(t *testing.T, p *rlsProcess) *loadRun {
	return startLoad(t, p.Client, faultWorkers, func(int, int) *rlsv3.RateLimitRequest {
		return request("fault", "client=load")
	})
}

// TestFaultRedisKilled kills redis-server under load: the node answers
// every request from its fallback, fast, at its share of the global limit,
// shows it, and goes back to Redis soon after Redis restarts.
func TestFaultRedisKilled(t *testing.T) {
	// Alone, not t.Parallel: it measures the server's latency (checkFast).
	const nodes = 2 // --fallback-nodes: this node enforces half the limit
	s := redistest.Start(t)
	p := startFaultRLS(t, "redis://"+s.Addr()+"/0", "--fallback-nodes", fmt.Sprint(nodes))
	probe := &layerProbe{p: p}
	base0 := serverTimes(t, p)
	load := loadOneKey(t, p)
	hold(time.Second)
	flapped := settle(t, p, probe)

	base1 := serverTimes(t, p)
	killed := time.Now()
	s.Kill()
	toFallback := pollFor(t, 2*time.Second, "ratelimit_fallback_active 1", func() bool {
		return metricIs(t, p, "ratelimit_fallback_active", 1)
	})
	calls, from := metricValue(t, p, redisCallsSeries), serverTimes(t, p)
	checkInFallback(t, p, probe)
	if v, _ := scrapeMetric(t, p, "ratelimit_live_nodes"); v != nodes {
		t.Errorf("ratelimit_live_nodes %v, want %d (--fallback-nodes)", v, nodes)
	}
	hold(2*time.Second - time.Since(killed))
	checkNoRedisCalls(t, p, calls, time.Since(killed)-toFallback)
	to := serverTimes(t, p)

	restarting := time.Now()
	s.Restart()
	waitGlobal(t, p, probe)
	back := backOnRedis(t, p, restarting, restarting)
	checkBackCounted(t, p)
	hold(500 * time.Millisecond)
	as, all := finishLoad(t, p, load)
	outage := restarting.Sub(killed)
	out := summarize(between(as, killed, restarting))
	base := summarize(between(as, time.Time{}, killed))
	bound := faultBurst/nodes + faultRate/nodes*outage.Seconds()
	t.Logf("redis killed for %v under %d workers: %d answers (%.0f/s), fallback after %v, back on global %v after the restart",
		outage.Round(time.Millisecond), faultWorkers, out.admitted+out.refused+out.errors,
		float64(out.admitted+out.refused)/outage.Seconds(), toFallback.Round(time.Millisecond), back.Round(time.Millisecond))
	t.Logf("outage: admitted %d, share bound burst/N + rate/N × outage = %.0f (N=%d); refusals by layer %v; latency %s (healthy before: %s)",
		out.admitted, bound, nodes, out.layers, out.latencies(), base.latencies())
	t.Logf("whole run: %d answers, latency %s; transitions to fallback before the kill %v, in all %v",
		len(as), all.latencies(), flapped, metricValue(t, p, toFallbackSeries))
	checkShare(t, out, bound, faultBurst/nodes)
	checkFast(t, "with redis down", base0, base1, from, to, out, base)
	// Refusals by the fallback when the load offered more than the share
	// (a starved test client may not).
	if float64(out.admitted+out.refused) > bound*1.1 && out.layers["fallback"] == 0 {
		t.Errorf("no refusal with x-ratelimit-layer: fallback during the outage (layers %v)", out.layers)
	}
	if back > recoverWithin {
		t.Errorf("back on the global layer %v after Redis restarted, want within %v", back, recoverWithin)
	}
}

// TestFaultRedisDebugSleep blocks Redis for 3s with DEBUG SLEEP under load.
func TestFaultRedisDebugSleep(t *testing.T) {
	// Alone, not t.Parallel: it measures the server's latency (checkFast).
	s := redistest.Start(t, redistest.WithArgs("--enable-debug-command", "local"))
	p := startFaultRLS(t, "redis://"+s.Addr()+"/0")
	admin := goredis.NewClient(&goredis.Options{Addr: s.Addr(), ReadTimeout: 10 * time.Second})
	defer admin.Close()
	// Dial now: sent as the client's first command, DEBUG SLEEP dialled
	// within the stall and reached Redis 1.4 s late on a loaded machine,
	// after the window the checks below hold Redis asleep.
	warm, cancelWarm := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelWarm()
	if err := admin.Ping(warm).Err(); err != nil {
		t.Fatalf("PING: %v", err)
	}
	done := make(chan error, 1)
	stallUnderLoad(t, p, 3*time.Second, func() {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			done <- admin.Do(ctx, "DEBUG", "SLEEP", "3").Err()
		}()
	}, func() {
		if err := <-done; err != nil {
			t.Fatalf("DEBUG SLEEP 3: %v", err)
		}
	})
}

// TestFaultRedisStalled stops redis-server with SIGSTOP for 3s under load:
// connections stay open and nothing answers, as with a network black hole.
// The node switches about 1s in (the stall probe's deadline), which leaves
// 2s of fallback to check.
func TestFaultRedisStalled(t *testing.T) {
	// Alone, not t.Parallel: it measures the server's latency (checkFast).
	s := redistest.Start(t)
	p := startFaultRLS(t, "redis://"+s.Addr()+"/0")
	stallUnderLoad(t, p, 3200*time.Millisecond, s.Stall, s.Resume) // resumed after 3s
}

// stallUnderLoad drives p with load, stalls its Redis with stall, calls
// resume 200ms before d has passed (resume returns once the stall is
// over), and checks that the node answered from its fallback, fast,
// without calling Redis, and went back to the global layer after.
func stallUnderLoad(t *testing.T, p *rlsProcess, d time.Duration, stall, resume func()) {
	t.Helper()
	probe := &layerProbe{p: p}
	base0 := serverTimes(t, p)
	load := loadOneKey(t, p)
	hold(time.Second)
	flapped := settle(t, p, probe)

	base1 := serverTimes(t, p)
	start := time.Now()
	stall()
	toFallback := pollFor(t, 2*time.Second, "ratelimit_fallback_active 1", func() bool {
		return metricIs(t, p, "ratelimit_fallback_active", 1)
	})
	calls, from := metricValue(t, p, redisCallsSeries), serverTimes(t, p)
	checkInFallback(t, p, probe)
	hold(d - 200*time.Millisecond - time.Since(start))
	checkNoRedisCalls(t, p, calls, time.Since(start)-toFallback)
	to := serverTimes(t, p)
	resume() // DEBUG SLEEP: returns when Redis answers again
	stalled := time.Since(start)
	over := time.Now()
	waitGlobal(t, p, probe)
	back := backOnRedis(t, p, start, over)
	checkBackCounted(t, p)
	hold(500 * time.Millisecond)
	as, all := finishLoad(t, p, load)
	st := summarize(between(as, start, over))
	base := summarize(between(as, time.Time{}, start))
	bound := faultBurst + faultRate*stalled.Seconds() // N = 1: this node alone
	t.Logf("redis stalled %v under %d workers: %d answers (%.0f/s), fallback after %v, back on global %v after the stall",
		stalled.Round(time.Millisecond), faultWorkers, st.admitted+st.refused+st.errors,
		float64(st.admitted+st.refused)/stalled.Seconds(), toFallback.Round(time.Millisecond), back.Round(time.Millisecond))
	t.Logf("stall: latency %s, slowest started %v into the stall (healthy before: %s); admitted %d (bound %.0f), refusals by layer %v; redis timeouts counted %v",
		st.latencies(), st.maxAt.Sub(start).Round(time.Millisecond), base.latencies(), st.admitted, bound, st.layers, metricValue(t, p, `ratelimit_redis_errors_total{kind="timeout"}`))
	t.Logf("whole run: %d answers, latency %s; transitions to fallback before the stall %v, in all %v",
		len(as), all.latencies(), flapped, metricValue(t, p, toFallbackSeries))
	checkShare(t, st, bound, 0)
	checkFast(t, "with redis stalled", base0, base1, from, to, st, base)
	if back > recoverWithin {
		t.Errorf("back on the global layer %v after the stall, want within %v", back, recoverWithin)
	}
}

// TestFaultClusterMasterDown kills one master of a 3-master cluster under
// load on buckets spread over all of them, then restarts it.
func TestFaultClusterMasterDown(t *testing.T) {
	// Alone, not t.Parallel: it measures the server's latency (checkFast).
	c := redistest.StartCluster(t, 3)
	p := startFaultRLS(t, strings.Join(c.Addrs(), ","))
	probe := &layerProbe{p: p}
	base0 := serverTimes(t, p)
	load := startLoad(t, p.Client, faultWorkers, func(w, i int) *rlsv3.RateLimitRequest {
		return request("fault", fmt.Sprintf("client=w%d-%d", w, i%8)) // 64 buckets on all masters
	})
	hold(time.Second)
	flapped := settle(t, p, probe)

	base1 := serverTimes(t, p)
	killed := time.Now()
	c.Master(1).Kill()
	toFallback := pollFor(t, 5*time.Second, "ratelimit_fallback_active 1", func() bool {
		return metricIs(t, p, "ratelimit_fallback_active", 1)
	})
	calls, from := metricValue(t, p, redisCallsSeries), serverTimes(t, p)
	checkInFallback(t, p, probe)
	hold(2*time.Second - time.Since(killed))
	checkNoRedisCalls(t, p, calls, time.Since(killed)-toFallback)
	to := serverTimes(t, p)

	restarting := time.Now()
	flapsBefore := metricValue(t, p, toFallbackSeries)
	c.Master(1).Restart()
	c.WaitOK()
	clusterOK := time.Since(restarting)
	waitGlobal(t, p, probe)
	back := time.Since(restarting)
	hold(500 * time.Millisecond)
	as, _ := finishLoad(t, p, load)
	out := summarize(between(as, killed, restarting))
	base := summarize(between(as, time.Time{}, killed))
	t.Logf("master 1 of 3 killed for %v: node in fallback after %v (the whole node, for every bucket); %d answers, latency %s (healthy before: %s)",
		restarting.Sub(killed).Round(time.Millisecond), toFallback.Round(time.Millisecond),
		out.admitted+out.refused+out.errors, out.latencies(), base.latencies())
	// A restarted master answers PING some seconds before it serves its
	// slots again (CLUSTERDOWN until it rejoins); the probe waits for
	// cluster_state:ok on every master, so the node must not go back and
	// forth meanwhile.
	if rejoin := metricValue(t, p, toFallbackSeries) - flapsBefore; rejoin > 1 {
		t.Errorf("%v transitions to fallback while the master rejoined, want at most 1", rejoin)
	}
	t.Logf("master restarted: cluster ok after %v, node on global %v after the restart; transitions to fallback: %v before the kill, %v while the master rejoined, %v in all",
		clusterOK.Round(time.Millisecond), back.Round(time.Millisecond), flapped,
		metricValue(t, p, toFallbackSeries)-flapsBefore, metricValue(t, p, toFallbackSeries))
	checkFast(t, "with a master down", base0, base1, from, to, out, base)
}

// TestFaultRedisRestartWipesData flushes the scripts of a live Redis, then
// restarts it under light load (nothing is persisted, so buckets and the
// script are gone): NOSCRIPT is handled without an error, buckets start
// full, and answers come from the global layer again. Its Redis calls
// get a generous --redis-timeout: it checks what a restart leaves, not how
// fast the node answers, and under a busy CPU the 10ms default sends some
// calls to the fallback with Redis up.
func TestFaultRedisRestartWipesData(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	p := startFaultRLS(t, "redis://"+s.Addr()+"/0", "--redis-timeout", "2s")
	probe := &layerProbe{p: p}
	admin := s.Client()
	waitGlobal(t, p, probe)
	const scriptErrors = `ratelimit_redis_errors_total{kind="script"}`
	const globalOK = `ratelimit_decisions_total{domain="fault",gray="false",layer="global",result="ok",rule="fault.slow"}`

	remaining := func(want uint32, when string) {
		t.Helper()
		resp := ask(t, p, "fault", "slow=w")
		if got := resp.GetStatuses()[0].GetLimitRemaining(); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || got != want {
			t.Errorf("slow=w %s: %v remaining %d, want OK remaining %d", when, resp.GetOverallCode(), got, want)
		}
	}
	remaining(4, "first")
	remaining(3, "second")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := admin.ScriptFlush(ctx).Err(); err != nil {
		t.Fatalf("SCRIPT FLUSH: %v", err)
	}
	// From Redis, not from the fallback, whose bucket would be full.
	remaining(2, "after SCRIPT FLUSH (the bucket survives, the script is loaded again)")

	load := startLoad(t, p.Client, 2, func(int, int) *rlsv3.RateLimitRequest { return request("fault", "client=light") })
	hold(200 * time.Millisecond)
	s.Restart()
	back := waitGlobal(t, p, probe)
	as := load.stop() // quiet from here: the checks below want the global layer, not a flap
	before := metricValue(t, p, globalOK)
	remaining(4, "after the restart wiped Redis (the bucket starts full)")
	if after := metricValue(t, p, globalOK); after != before+1 {
		t.Errorf("%s went %v → %v, want one more: the answer after the restart came from the global layer", globalOK, before, after)
	}
	keys, err := admin.Keys(ctx, "*").Result()
	if err != nil || len(keys) == 0 {
		t.Errorf("keys after the restart and new traffic: %v, %v; want the buckets written again", keys, err)
	}

	st := summarize(as)
	if st.errors > 0 {
		t.Errorf("%d gRPC errors of %d answers, want 0; first: %v", st.errors, len(as), st.firstErr)
	}
	if v := metricValue(t, p, scriptErrors); v != 0 {
		t.Errorf("%s = %v, want 0: NOSCRIPT must be handled by loading the script again", scriptErrors, v)
	}
	select {
	case <-p.exited:
		t.Fatalf("rls exited: %v", p.err)
	default:
	}
	t.Logf("restart with data loss: back on global %v after Redis answered PING; transitions to fallback %v, %d answers, %s 0",
		back.Round(time.Millisecond), metricValue(t, p, toFallbackSeries), len(as), scriptErrors)
}

// settle waits until p answers from the global layer before a fault is
// injected, and returns how often it went to fallback so far: under -race
// on a small machine, calls on cold connections (dial, first EVAL) can miss
// the 10ms deadline when a load starts.
func settle(t *testing.T, p *rlsProcess, probe *layerProbe) float64 {
	t.Helper()
	waitGlobal(t, p, probe)
	return metricValue(t, p, toFallbackSeries)
}

// layerProbe reports which layer answers global rules right now: it spends
// the one token of a fresh `once` bucket and returns the x-ratelimit-layer
// of the refusal that follows ("global" or "fallback"; "" if not refused).
type layerProbe struct {
	p *rlsProcess
	n int
}

func (lp *layerProbe) layer(t *testing.T) string {
	t.Helper()
	lp.n++
	d := fmt.Sprintf("once=probe-%d", lp.n)
	ask(t, lp.p, "fault", d)
	resp := ask(t, lp.p, "fault", d)
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		return ""
	}
	return headerValue(resp, "x-ratelimit-layer")
}

// waitGlobal waits until p answers from the global layer (a refusal says
// global), with the fallback gauge at 0 and /healthcheck naming redis, and
// returns how long that took.
func waitGlobal(t *testing.T, p *rlsProcess, probe *layerProbe) time.Duration {
	t.Helper()
	return pollFor(t, 10*time.Second, "the global layer (refusals, gauge and health check)", func() bool {
		if probe.layer(t) != "global" || !metricIs(t, p, "ratelimit_fallback_active", 0) {
			return false
		}
		code, body := p.HTTPGet(t, "/healthcheck")
		return code == 200 && strings.Contains(body, "global layer: redis")
	})
}

// checkBackCounted checks that the switch back to Redis was counted.
func checkBackCounted(t *testing.T, p *rlsProcess) {
	t.Helper()
	if v := metricValue(t, p, toRedisSeries); v < 1 {
		t.Errorf("%s = %v after recovery, want ≥ 1", toRedisSeries, v)
	}
}

// finishLoad stops the load, waits for p to settle on the global layer and
// checks that no answer of the whole run was a gRPC error.
func finishLoad(t *testing.T, p *rlsProcess, load *loadRun) ([]answer, loadStats) {
	t.Helper()
	as := load.stop()
	settled(t, p)
	all := summarize(as)
	if all.errors > 0 {
		t.Errorf("%d gRPC errors of %d answers, want 0; first: %v", all.errors, len(as), all.firstErr)
	}
	return as, all
}

// settled checks that p, its load stopped, stays on (or returns within the
// probe's longest backoff to) the global layer.
func settled(t *testing.T, p *rlsProcess) {
	t.Helper()
	pollFor(t, 3*time.Second, "ratelimit_fallback_active 0 at the end", func() bool {
		return metricIs(t, p, "ratelimit_fallback_active", 0)
	})
}

// transitionLines returns the fallback warnings p logged, one per
// transition, shortened to time, message and error.
func transitionLines(p *rlsProcess) string {
	var b strings.Builder
	for line := range strings.SplitSeq(p.Log(), "\n") {
		if !strings.Contains(line, "msg=\"Redis failed") && !strings.Contains(line, "msg=\"Redis answers again") {
			continue
		}
		if _, after, ok := strings.Cut(line, "T"); ok { // drop the date
			line = after
		}
		line, _, _ = strings.Cut(line, " mode=")
		b.WriteString("  " + strings.Replace(line, " level=WARN", "", 1) + "\n")
	}
	return b.String()
}

// checkInFallback checks what an operator sees while the node is in
// fallback: the gauge, a counted transition, a 200 health check naming the
// fallback, the warning log line, and refusals from the fallback layer.
func checkInFallback(t *testing.T, p *rlsProcess, probe *layerProbe) {
	t.Helper()
	if !metricIs(t, p, "ratelimit_fallback_active", 1) {
		t.Errorf("ratelimit_fallback_active is not 1 while Redis fails")
	}
	if v := metricValue(t, p, toFallbackSeries); v < 1 {
		t.Errorf(`ratelimit_fallback_transitions_total{to="fallback"} = %v, want ≥ 1`, v)
	}
	code, body := p.HTTPGet(t, "/healthcheck")
	if code != 200 || !strings.Contains(body, "fallback") {
		t.Errorf("/healthcheck in fallback: %d %q, want 200 mentioning fallback", code, body)
	}
	if !strings.Contains(p.Log(), "Redis failed: answering from the fallback until it recovers") {
		t.Errorf("no fallback warning in the log")
	}
	if l := probe.layer(t); l != "fallback" {
		t.Errorf("refusal while Redis fails from layer %q, want fallback", l)
	}
}

// checkShare checks the answers admitted from the fallback against the
// share bound (plus slack for rounding and the requests in flight when
// Redis failed) and, when the load offered much more, against floor.
func checkShare(t *testing.T, st loadStats, bound, floor float64) {
	t.Helper()
	if float64(st.admitted) > bound*1.01+faultWorkers {
		t.Errorf("admitted %d while Redis failed, want at most the share %.0f", st.admitted, bound)
	}
	if offered := st.admitted + st.refused; float64(offered) > 2*bound && float64(st.admitted) < floor {
		t.Errorf("admitted %d of %d while Redis failed, want at least the burst share %.0f", st.admitted, offered, floor)
	}
}

// requestTimes is the server's own ratelimit_request_duration_seconds at
// one moment: requests decided, and those decided within failP99.
type requestTimes struct{ count, fast float64 }

// serverTimes scrapes p's request-duration histogram, both series from
// one scrape (two scrapes would count requests decided in between in one
// of them only).
func serverTimes(t *testing.T, p *rlsProcess) requestTimes {
	t.Helper()
	code, body := p.HTTPGet(t, "/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	var rt requestTimes
	var found int
	for line := range strings.SplitSeq(body, "\n") {
		for series, v := range map[string]*float64{
			"ratelimit_request_duration_seconds_count":             &rt.count,
			`ratelimit_request_duration_seconds_bucket{le="0.02"}`: &rt.fast,
		} {
			if rest, ok := strings.CutPrefix(line, series+" "); ok {
				f, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
				if err != nil {
					t.Fatalf("/metrics %s: %v", series, err)
				}
				*v = f
				found++
			}
		}
	}
	if found != 2 {
		t.Fatalf("/metrics lacks the request-duration histogram")
	}
	return rt
}

// checkFast checks that the requests p decided between from and to (while
// Redis failed) took the server under failP99 (Envoy's 20ms timeout) at
// the 99th percentile, as the server's own histogram says: a client's wall
// time on a saturated machine measures the machine, not the server. When
// the server was already slow with Redis healthy (between base0 and base1,
// 1% or more of its requests at failP99 or over: other jobs starving a
// small -race machine), only "no slower than 3 times that share" is
// asserted, and the test says so; that a failing Redis adds no wait is
// proven regardless by checkNoRedisCalls. Client latencies st and base are
// logged for the record.
func checkFast(t *testing.T, when string, base0, base1, from, to requestTimes, st, base loadStats) {
	t.Helper()
	slowShare := func(a, b requestTimes) (n, slow float64) {
		n = b.count - a.count
		return n, n - (b.fast - a.fast)
	}
	n, slow := slowShare(from, to)
	bn, bslow := slowShare(base0, base1)
	t.Logf("%s: the server decided %.0f requests, %.0f of them in %v or more (with Redis healthy: %.0f of %.0f); clients saw %s (with Redis healthy: %s)",
		when, n, slow, failP99, bslow, bn, st.latencies(), base.latencies())
	if n == 0 {
		t.Errorf("%s: the server decided no request", when)
		return
	}
	if slow <= 0.01*n {
		return
	}
	if bn > 0 && bslow >= 0.01*bn {
		t.Logf("busy machine: with Redis healthy %.1f%% of requests already took the server %v or more; asserting only under 3× that", 100*bslow/bn, failP99)
		if slow/n >= 3*bslow/bn {
			t.Errorf("%s: %.0f of %.0f requests took the server %v or more, want under 3 × %.1f%% (with Redis healthy)", when, slow, n, failP99, 100*bslow/bn)
		}
		return
	}
	t.Errorf("%s: %.0f of %.0f requests took the server %v or more, want under 1%%", when, slow, n, failP99)
}

// backOnRedis returns how long after ref p logged that Redis answers
// again, by the log's own time, which does not wait for the test's polling
// on a saturated machine: its first such line after since (when the fault
// began), 0 if that came before ref (when the test saw Redis answer: a
// starved test may see it late).
func backOnRedis(t *testing.T, p *rlsProcess, since, ref time.Time) time.Duration {
	t.Helper()
	for line := range strings.SplitSeq(p.Log(), "\n") {
		if !strings.Contains(line, `msg="Redis answers again`) {
			continue
		}
		v, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		at, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if at.After(since) {
			return max(0, at.Sub(ref))
		}
	}
	t.Fatalf("no \"Redis answers again\" line logged after %v", since)
	return 0
}

// checkNoRedisCalls checks that no request called Redis since the global
// layer's call count was before, during d in fallback: no answer waited on
// the failing Redis.
func checkNoRedisCalls(t *testing.T, p *rlsProcess, before float64, d time.Duration) {
	t.Helper()
	if got := metricValue(t, p, redisCallsSeries) - before; got != 0 {
		t.Errorf("%v Redis calls in %v of fallback, want 0: requests must not wait on a failing Redis", got, d.Round(time.Millisecond))
	}
}

// ask sends one request of descriptors "k=v,k=v" with a deadline.
func ask(t *testing.T, p *rlsProcess, domain string, descs ...string) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	resp, err := p.Client.ShouldRateLimit(ctx, request(domain, descs...))
	if err != nil {
		t.Fatalf("ShouldRateLimit(%s %v): %v", domain, descs, err)
	}
	return resp
}

func metricIs(t *testing.T, p *rlsProcess, series string, want float64) bool {
	t.Helper()
	v, ok := scrapeMetric(t, p, series)
	return ok && v == want
}

// metricValue returns a series' value; a missing series fails the test.
func metricValue(t *testing.T, p *rlsProcess, series string) float64 {
	t.Helper()
	v, ok := scrapeMetric(t, p, series)
	if !ok {
		t.Fatalf("/metrics lacks %s", series)
	}
	return v
}
