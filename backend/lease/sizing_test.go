package lease

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/backend/leaseproto"
	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/internal/redistest"
)

// sizingSweep runs the sizing sweeps (docs/benchmarks.md, "Lease sizing").
var sizingSweep = flag.Bool("sweep", false, "run the lease sizing sweeps (TestSizingSweep, TestSizingFast)")

// The sizing simulation (TestSizingDefaults, TestSizingSweep,
// TestSizingFast) runs N
// Limiters ("nodes") on one real redis-server and one fake clock, so that
// it counts, and never times: every figure is a count of decisions, calls
// and tokens, the same on a busy machine as on an idle one.
//
// Redis' buckets run on Redis' clock (lease.lua reads TIME), which the
// fake clock does not move. simLeaser makes the simulation sound anyway:
// it sends Redis every limit slowed down simScale times (in real time a
// bucket refills 10⁻⁷ of its rate: nothing in a run), and refills the
// bucket itself, on the fake clock, before each call: simRefill moves the
// bucket's TAT back by the tokens the limit added since its last call
// (never past Redis' now: a full bucket, as refilling does). Nobody sees
// the bucket between calls, so the bucket each call sees is the one the
// limit would have at that fake instant (in whole tokens). The durations
// of Redis' replies are scaled back, and the windows of lease.lua's count
// of parked tokens are scaled up as the limits (a real second of a run is
// more than a lease period of fake time: the count never drops a lease on
// its own, only the nodes' give-backs take them out).
//
// The nodes' background work (Run) is driven by the simulation too: a
// node's prefetch is sent one simRTT after the decision that queued it
// (the round trip a real Run's call would take), and every node's expired
// leases go back every DefaultTick. A decision that needs Redis is
// answered at once (the decisions of one node that would queue behind its
// call and share it are not modelled, so calls are an upper bound).
const (
	simScale = 10_000_000
	simRTT   = time.Millisecond
)

// sizing is one setting of the lease knobs.
type sizing struct {
	nodes          int
	share          uint64 // a lease is at most left / (share × nodes)
	lowNum, lowDen uint64 // the low-water mark, of the last lease
	period         time.Duration
	rtt            time.Duration // a prefetch's round trip (simRTT when 0)
	maxLease       uint64        // Options.MaxLease (DefaultMaxLease when 0)
	// noLease leases nothing (every lease op's Extra 0): every decision is
	// Redis', as in exact mode with the empty-bucket cache, for reference.
	noLease bool
}

func (s sizing) String() string {
	if s.noLease {
		return fmt.Sprintf("nodes %d, no leases", s.nodes)
	}
	return fmt.Sprintf("nodes %d, share %d×N, low %d/%d, period %v, rtt %v", s.nodes, s.share, s.lowNum, s.lowDen, s.period, cmp.Or(s.rtt, simRTT))
}

// defaultSizing is the Limiter's defaults on n nodes.
func defaultSizing(n int) sizing {
	return sizing{nodes: n, share: 2, lowNum: lowWaterNum, lowDen: lowWaterDen, period: DefaultPeriod}
}

// workload is the load on one hot key.
type workload struct {
	name string
	load float64 // offered requests, in times the limit's rate
	skew float64 // the part of the load on node 0 (0: spread evenly)
}

var (
	wBelow = workload{name: "below", load: 0.1}
	wNear  = workload{name: "near", load: 0.9}
	wOver  = workload{name: "over", load: 1.5}
	wSkew  = workload{name: "skew", load: 1.5, skew: 0.9}
)

// sizingResult is what one simulation counted.
type sizingResult struct {
	decisions, admitted int64
	calls               int64 // Lease calls of the nodes (decisions' and background)
	waited              int64 // decisions that waited on a Redis call
	peakParked          uint64
	bound               float64 // burst + rate × T
	// shortfall is the most the fleet was ever behind exact admission:
	// the requests one bucket deciding every request in arrival order
	// (refilled as simLeaser refills) had admitted by then, minus the
	// fleet's.
	shortfall int64
	// exact is what that bucket admitted over the run.
	exact int64
}

func (r sizingResult) callsPerDecision() float64 {
	return float64(r.calls) / float64(r.decisions)
}
func (r sizingResult) waitedPerDecision() float64 {
	return float64(r.waited) / float64(r.decisions)
}

// admittedOfBound is the admitted fraction of burst + rate × T.
func (r sizingResult) admittedOfBound() float64 { return float64(r.admitted) / r.bound }

// simLeaser is the nodes' Leaser: a real redis-server, its limits slowed
// down simScale times and refilled on the fake clock (see above).
type simLeaser struct {
	r        *redisbackend.Limiter
	c        goredis.UniversalClient
	rkey     string // the bucket's Redis key
	clock    clockwork.Clock
	start    time.Time
	key      bucket.Key
	lim      bucket.Limit // as the nodes see it
	share    uint64       // the divisor of every lease: sizing.share × nodes
	noLease  bool         // every op's Extra 0
	refilled uint64       // tokens the simulation gave as refill
	calls    int64        // the nodes' calls (the simulation is sequential)
}

// simRefill adds ARGV[1] tokens to the leased bucket KEYS[1] as time
// does: its TAT (the value's first double) moves back by that many token
// intervals (the value's third), never past Redis' now; the rest of the
// value (lease.lua's count of parked tokens included) is kept. No value,
// or one lease.lua reads as a full bucket: nothing to do.
var simRefill = goredis.NewScript(`
local s = redis.call('GET', KEYS[1])
if not s or (#s ~= 32 and #s ~= 72) then return 0 end
local tat, _, iv = struct.unpack('<ddd', s)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local new = tat - tonumber(ARGV[1]) * iv
if new < now then new = now end
redis.call('SET', KEYS[1], struct.pack('<d', new) .. string.sub(s, 9), 'KEEPTTL')
return 1
`)

// simSlow is lim as Redis sees it.
func simSlow(lim bucket.Limit) bucket.Limit {
	lim.Period *= simScale
	return lim
}

func (s *simLeaser) Lease(ctx context.Context, ops []leaseproto.Op, out []leaseproto.Reply) error {
	s.calls++
	sops := make([]leaseproto.Op, 0, len(ops)+1)
	due := s.lim.Requests * uint64(s.clock.Since(s.start)) / uint64(s.lim.Period)
	if due > s.refilled && len(ops) > 0 {
		if err := simRefill.Run(ctx, s.c, []string{s.rkey}, due-s.refilled).Err(); err != nil {
			return err
		}
		s.refilled = due
	}
	for _, op := range ops {
		op.Limit = simSlow(op.Limit)
		op.Window *= simScale
		if op.Share > 0 {
			op.Share = s.share
		}
		if s.noLease {
			op.Extra = 0
		}
		sops = append(sops, op)
	}
	sout := make([]leaseproto.Reply, len(sops))
	if err := s.r.Lease(ctx, sops, sout); err != nil {
		return err
	}
	for i, rep := range sout[len(sops)-len(ops):] {
		rep.Retry /= simScale
		rep.Reset /= simScale
		out[i] = rep
	}
	return nil
}

// simulate runs workload w on the key of limit lim for T of fake time
// under sizing sz, every node a Limiter with the defaults but sz's knobs
// (first decisions exact, as rls serve).
func simulate(t testing.TB, c goredis.UniversalClient, name string, sz sizing, w workload, lim bucket.Limit, T time.Duration) sizingResult {
	t.Helper()
	clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	r := redisbackend.New(redisbackend.Options{
		Client: c, Prefix: strings.NewReplacer("/", "-", " ", "_", ",", "").Replace(name), // as prefix below
		Timeout: 10 * time.Second, CacheSize: -1,
	})
	defer r.Close()
	prefix := strings.NewReplacer("/", "-", " ", "_", ",", "").Replace(name)
	key := bucket.SumKey([]byte(name))
	sim := &simLeaser{r: r, c: c, rkey: fmt.Sprintf("%s:lease:{%x}", prefix, key[:]), clock: clock, start: clock.Now(), key: key, lim: lim, share: sz.share * uint64(sz.nodes), noLease: sz.noLease}
	n := sz.nodes
	nodes := make([]*Limiter, n)
	for i := range nodes {
		nodes[i] = New(Options{Leaser: sim, Default: Leased, Clock: clock, Period: sz.period, MaxLease: sz.maxLease, Nodes: func() int { return n }})
		nodes[i].lowNum, nodes[i].lowDen = sz.lowNum, sz.lowDen
	}
	// Arrivals: node i's rate, its requests evenly spaced, the nodes'
	// phases spread over an interval.
	rate := w.load * float64(lim.Requests) / lim.Period.Seconds()
	rates := make([]float64, n)
	for i := range rates {
		switch {
		case w.skew > 0 && n > 1 && i == 0:
			rates[i] = rate * w.skew
		case w.skew > 0 && n > 1:
			rates[i] = rate * (1 - w.skew) / float64(n-1)
		default:
			rates[i] = rate / float64(n)
		}
	}
	arrival := func(i int, j int64) time.Duration {
		return time.Duration((float64(j) + float64(i+1)/float64(n+1)) / rates[i] * float64(time.Second))
	}
	seq := make([]int64, n)             // node i's next request
	fetchAt := make([]time.Duration, n) // node i's prefetch, or -1
	for i := range fetchAt {
		fetchAt[i] = -1
	}
	tick := DefaultTick
	rtt := cmp.Or(sz.rtt, simRTT)
	ctx := context.Background()
	hits := []bucket.Hit{{Key: sim.key, Limit: lim, Cost: 1}}
	states := make([]bucket.State, 1)
	res := sizingResult{bound: float64(lim.Burst) + float64(lim.Requests)*T.Seconds()/lim.Period.Seconds()}
	// The exact reference: one bucket, every request in arrival order.
	var ref struct{ tokens, due uint64 }
	ref.tokens = lim.Burst
	var refAdmitted int64
	parked := func() uint64 {
		var sum uint64
		for _, l := range nodes {
			l.mu.Lock()
			if e := l.entries[sim.key]; e != nil {
				sum += e.held
			}
			l.mu.Unlock()
		}
		return sum
	}
	for {
		// The next event: a tick, a prefetch, then a request (in that
		// order at one instant).
		at, what, who := tick, 't', -1
		for i := range nodes {
			if fetchAt[i] >= 0 && fetchAt[i] < at {
				at, what, who = fetchAt[i], 'f', i
			}
		}
		for i := range nodes {
			if a := arrival(i, seq[i]); a < at {
				at, what, who = a, 'r', i
			}
		}
		if at >= T {
			break
		}
		clock.Advance(sim.start.Add(at).Sub(clock.Now()))
		switch what {
		case 't':
			for _, l := range nodes {
				if err := l.step(ctx, stepTick); err != nil {
					t.Fatal(err)
				}
			}
			tick += DefaultTick
		case 'f':
			fetchAt[who] = -1
			if err := nodes[who].step(ctx, stepFetch); err != nil {
				t.Fatal(err)
			}
		case 'r':
			seq[who]++
			l := nodes[who]
			calls := sim.calls
			d, err := l.Hit(ctx, hits, states)
			if err != nil {
				t.Fatal(err)
			}
			res.decisions++
			if d.Allowed {
				res.admitted++
			}
			if sim.calls > calls {
				res.waited++
			}
			due := lim.Requests * uint64(at) / uint64(lim.Period)
			ref.tokens, ref.due = min(ref.tokens+due-ref.due, lim.Burst), due
			if ref.tokens > 0 {
				ref.tokens--
				refAdmitted++
			}
			res.shortfall = max(res.shortfall, refAdmitted-res.admitted)
			l.mu.Lock()
			queued := len(l.fetch) > 0
			l.mu.Unlock()
			if queued && fetchAt[who] < 0 {
				fetchAt[who] = at + rtt
			}
		}
		res.peakParked = max(res.peakParked, parked())
	}
	res.calls = sim.calls
	res.exact = refAdmitted
	for _, l := range nodes {
		if err := l.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if float64(res.admitted) > res.bound {
		t.Errorf("%s, %s: admitted %d, over burst + rate × T = %.0f", sz, w.name, res.admitted, res.bound)
	}
	return res
}

// sizingLimit is the sweep's limit: 1000 requests per second, a burst of
// one second's worth (rls serve's default burst is the unit's requests).
var sizingLimit = bucket.Limit{Requests: 1000, Period: time.Second, Burst: 1000}

// sizingT is the simulated time of a sweep's run: 10 s.
const sizingT = 10 * time.Second

// defaultsT is TestSizingDefaults' simulated time: 4 s, which holds
// about four lease periods and as many prefetches per node, and makes
// 6,000 decisions per run over the limit (every one a Redis call in the
// runs leasing nothing), where 10 s made the suite's slowest test.
const defaultsT = 4 * time.Second

// TestSizingDefaults holds the defaults to what the sweep found, with
// bounds that follow from the design. On 3 nodes at 1.5× the limit,
// spread evenly or 90% on one node, the fleet admits 97–100% of burst +
// rate × T (the leased layer's goal) with no more Redis calls than the same nodes
// leasing nothing (every decision Redis', as exact mode). Far below the
// limit, every request is admitted and a node makes at most two calls per
// lease period (a lease, its give-back), one of which a decision waits on.
func TestSizingDefaults(t *testing.T) {
	if testing.Short() {
		t.Skip("a 10 s simulation of 3 nodes")
	}
	srv := redistest.Start(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	defer c.Close()
	const n = 3
	sz := defaultSizing(n)
	exact := sz
	exact.noLease = true
	for _, w := range []workload{wOver, wSkew} {
		res := simulate(t, c, t.Name()+"/"+w.name, sz, w, sizingLimit, defaultsT)
		ref := simulate(t, c, t.Name()+"/"+w.name+"-exact", exact, w, sizingLimit, defaultsT)
		t.Logf("%s: %+v; leasing nothing: %+v", w.name, res, ref)
		// The simulation is sound: nodes that lease nothing admit what one
		// exact bucket in Go admits, but for the empty-bucket cache's
		// refusals (at most one token interval late each).
		if ref.admitted > ref.exact || ref.admitted < ref.exact-1 || ref.shortfall > 1 {
			t.Errorf("%s: nodes leasing nothing admitted %d (at worst %d behind), an exact bucket %d", w.name, ref.admitted, ref.shortfall, ref.exact)
		}
		if f := res.admittedOfBound(); f < 0.97 {
			t.Errorf("%s: admitted %.2f%% of burst + rate × T, want ≥ 97%%", w.name, 100*f)
		}
		if res.calls > ref.calls {
			t.Errorf("%s: %d Redis calls, more than the %d of nodes leasing nothing", w.name, res.calls, ref.calls)
		}
	}
	res := simulate(t, c, t.Name()+"/below", sz, wBelow, sizingLimit, defaultsT)
	t.Logf("below: %+v", res)
	if res.admitted != res.decisions {
		t.Errorf("below: admitted %d of %d", res.admitted, res.decisions)
	}
	periods := int64(defaultsT/sz.period) + 1
	if res.calls > 2*n*periods || res.waited > n*periods {
		t.Errorf("below: %d Redis calls, %d decisions waited on one; want ≤ %d and ≤ %d (a lease and a give-back per node per period)",
			res.calls, res.waited, 2*n*periods, n*periods)
	}
}

// TestSizingSweep (go test -run TestSizingSweep -sweep ./backend/lease)
// runs every setting of the knobs on each workload and logs the table of
// docs/benchmarks.md ("Lease sizing").
func TestSizingSweep(t *testing.T) {
	if !*sizingSweep {
		t.Skip("the sweep runs with -sweep")
	}
	srv := redistest.Start(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	defer c.Close()
	var b strings.Builder
	fmt.Fprintln(&b, "| workload | nodes | share | low water | period | calls/decision | waited/decision | admitted/(burst + rate × T) | admitted/offered | peak parked | peak shortfall |")
	fmt.Fprintln(&b, "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	run := 0
	for _, w := range []workload{wBelow, wNear, wOver, wSkew} {
		for _, n := range []int{1, 3, 10} {
			if w.skew > 0 && n == 1 {
				continue // one node: the over workload
			}
			sizings := []sizing{{nodes: n, share: 2, lowNum: 1, lowDen: 2, period: time.Second, noLease: true}}
			for _, share := range []uint64{1, 2, 4} {
				for _, low := range [][2]uint64{{1, 4}, {1, 2}, {3, 4}} {
					for _, p := range []time.Duration{250 * time.Millisecond, time.Second, 4 * time.Second} {
						sizings = append(sizings, sizing{nodes: n, share: share, lowNum: low[0], lowDen: low[1], period: p})
					}
				}
			}
			for _, sz := range sizings {
				run++
				res := simulate(t, c, fmt.Sprintf("%s/%d", t.Name(), run), sz, w, sizingLimit, sizingT)
				knobs := fmt.Sprintf("%d×N | %d/%d | %v", sz.share, sz.lowNum, sz.lowDen, sz.period)
				if sz.noLease {
					knobs = "no leases | | "
				}
				fmt.Fprintf(&b, "| %s | %d | %s | %.4f | %.4f | %.2f%% | %.2f%% | %d | %d |\n",
					w.name, n, knobs, res.callsPerDecision(), res.waitedPerDecision(),
					100*res.admittedOfBound(), 100*float64(res.admitted)/float64(res.decisions), res.peakParked, res.shortfall)
			}
		}
	}
	t.Log("\n" + b.String())
}

// fastLimit is the limit of TestSizingSweep's second part: fast enough that
// a node's rate × a prefetch's round trip reaches the low-water mark of a
// lease capped at DefaultMaxLease.
var fastLimit = bucket.Limit{Requests: 50_000, Period: time.Second, Burst: 50_000}

// TestSizingFast (go test -run TestSizingFast -sweep ./backend/lease) runs
// the low-water marks at 90% of fastLimit, for round trips of 1 and 10 ms,
// and the default mark with a lease cap 10 times the default.
func TestSizingFast(t *testing.T) {
	if !*sizingSweep {
		t.Skip("the sweep runs with -sweep")
	}
	srv := redistest.Start(t)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr()})
	defer c.Close()
	var b strings.Builder
	fmt.Fprintln(&b, "| nodes | round trip | low water | max lease | calls/decision | waited/decision | peak parked |")
	fmt.Fprintln(&b, "|--:|--:|--:|--:|--:|--:|--:|")
	run := 0
	for _, n := range []int{1, 3} {
		for _, rtt := range []time.Duration{time.Millisecond, 10 * time.Millisecond} {
			var sizings []sizing
			for _, low := range [][2]uint64{{1, 4}, {1, 2}, {3, 4}} {
				sz := defaultSizing(n)
				sz.lowNum, sz.lowDen, sz.rtt = low[0], low[1], rtt
				sizings = append(sizings, sz)
			}
			big := defaultSizing(n)
			big.rtt, big.maxLease = rtt, 10*DefaultMaxLease
			for _, sz := range append(sizings, big) {
				run++
				res := simulate(t, c, fmt.Sprintf("%s/%d", t.Name(), run), sz, wNear, fastLimit, sizingT)
				fmt.Fprintf(&b, "| %d | %v | %d/%d | %d | %.5f | %.5f | %d |\n", n, rtt, sz.lowNum, sz.lowDen,
					cmp.Or(sz.maxLease, DefaultMaxLease), res.callsPerDecision(), res.waitedPerDecision(), res.peakParked)
			}
		}
	}
	t.Log("\n" + b.String())
}
