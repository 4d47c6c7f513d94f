package share_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rls/sluice/backend/share"
	"github.com/sluice-rls/sluice/bucket"
)

// A rule of 60 a minute, burst 60, half of it shared: on 3 nodes each
// cell holds 10 tokens refilling 10 a minute; Redis' part holds 30,
// refilling 30 a minute.
var (
	perMinute = bucket.Limit{Requests: 60, Period: time.Minute, Burst: 60}
	redisPart = bucket.Limit{Requests: 60, Period: 2 * time.Minute, Burst: 30}
)

const half = 500_000

func takeOf(k string, cost uint64) bucket.Hit {
	return bucket.Hit{Key: key(k), Limit: perMinute, Cost: cost, Rule: shareRule(half)}
}

// Takes that fit the cell are decided with no call behind; the next goes
// behind at Redis' part, and reports both parts' tokens.
func TestFitsCellNoCallBehind(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3, 0)
	for i := range 10 {
		d, st := f.hit(t, takeOf("a", 1))
		if !d.Allowed || d.Answer != bucket.Decided || st[0].Remaining != uint64(9-i) {
			t.Fatalf("take %d: %+v %+v, want allowed from the cell with %d left", i, d, st[0], 9-i)
		}
	}
	if n := f.behind.count(); n != 0 {
		t.Fatalf("%d calls behind for takes that fit the cell, want 0", n)
	}
	d, st := f.hit(t, takeOf("a", 1))
	if !d.Allowed || st[0].Remaining != 29 {
		t.Errorf("11th take: %+v %+v, want allowed by Redis' part with 29 left", d, st[0])
	}
	if h := f.behind.last(t); len(h) != 1 || h[0].Limit != redisPart || h[0].Cost != 1 {
		t.Errorf("behind got %+v, want one take at Redis' part %+v", h, redisPart)
	}
}

// A call refused behind gives back what the cells gave it.
func TestRefusedBehindGivesBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3, 0)
	tight := bucket.Hit{Key: key("b"), Limit: bucket.Limit{Requests: 1, Period: time.Hour, Burst: 2}, Cost: 3}
	d, st := f.hit(t, takeOf("a", 4), tight)
	if d.Allowed || !st[0].Allowed || st[0].Remaining != 10 || st[1].Allowed {
		t.Fatalf("call: %+v %+v, want refused by b, a's take allowed by its cell and given back (10 left)", d, st)
	}
	for i := range 10 {
		if d, _ := f.hit(t, takeOf("a", 1)); !d.Allowed {
			t.Fatalf("take %d after the give-back refused", i)
		}
	}
	if n := f.behind.count(); n != 1 {
		t.Errorf("%d calls behind, want 1: the cell holds its 10 tokens again", n)
	}
}

// A call the layer behind fails gives back too, and returns the error.
func TestFailedBehindGivesBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3, 0)
	f.behind.err = errBehind
	other := bucket.Hit{Key: key("b"), Limit: perMinute, Cost: 1}
	if _, err := f.l.Hit(context.Background(), []bucket.Hit{takeOf("a", 10), other}, make([]bucket.State, 2)); err != errBehind {
		t.Fatalf("Hit error %v, want %v", err, errBehind)
	}
	f.behind.err = nil
	if d, st := f.hit(t, takeOf("a", 10)); !d.Allowed || st[0].Remaining != 0 || f.behind.count() != 1 {
		t.Errorf("after the failure: %+v %+v, %d calls behind; want the cell's 10 tokens back", d, st[0], f.behind.count())
	}
}

// Not admitted, the node takes nothing from its cells and sends share
// hits to Redis' part, never the whole limit; its cells refill nothing
// meanwhile, and are empty when it is admitted again.
func TestNotAdmitted(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3, 0)
	f.hit(t, takeOf("a", 4))
	f.member.set(3, false)
	if d, _ := f.hit(t, takeOf("a", 1)); !d.Allowed {
		t.Fatal("take while not admitted refused")
	}
	if h := f.behind.last(t); h[0].Limit != redisPart {
		t.Errorf("not admitted, behind got limit %+v, want Redis' part %+v", h[0].Limit, redisPart)
	}
	f.clock.Advance(time.Hour)
	f.member.set(3, true)
	before := f.behind.count()
	if f.hit(t, takeOf("a", 1)); f.behind.count() != before+1 {
		t.Error("admitted again after an hour out, a take fit the cell: it kept its 6 tokens or refilled while out")
	}
	f.clock.Advance(30 * time.Second) // 5 tokens at 10 a minute
	if f.hit(t, takeOf("a", 5)); f.behind.count() != before+1 {
		t.Error("admitted again, the cell did not refill from then")
	}
	if f.hit(t, takeOf("a", 1)); f.behind.count() != before+2 {
		t.Error("admitted again, the cell holds more than it refilled since")
	}
}

// interleaved is a Membership that lets another call run, once, between
// answering a call and that call going on: as a call descheduled right
// after it looked.
type interleaved struct {
	*members
	between func()
}

func (m *interleaved) ShareAt(now time.Time) (int, bool) {
	n, ok := m.members.ShareAt(now)
	if f := m.between; f != nil {
		m.between = nil
		f()
	}
	return n, ok
}

// A call that saw the share held, then waited while the node was out
// for an hour, records the holding when it goes on, not when it looked:
// the cells hold nothing refilled while the node was out.
func TestLateLookEmptiesLater(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3, 0)
	m := &interleaved{members: f.member}
	l := share.New(share.Options{Inner: f.behind, Membership: m, Clock: f.clock})
	f.held(l) // l's cells are full
	ctx, st := context.Background(), make([]bucket.State, 1)
	m.between = func() {
		f.member.set(3, false)
		f.clock.Advance(time.Hour)
		if _, err := l.Hit(ctx, []bucket.Hit{takeOf("b", 1)}, st); err != nil { // sees the node out
			t.Error(err)
		}
		f.member.set(3, true)
	}
	if _, err := l.Hit(ctx, []bucket.Hit{takeOf("a", 1)}, st); err != nil { // looked an hour ago
		t.Fatal(err)
	}
	before := f.behind.count()
	if _, err := l.Hit(ctx, []bucket.Hit{takeOf("a", 1)}, st); err != nil || f.behind.count() != before+1 {
		t.Errorf("right after the late call: %v, %d calls behind, want 1: the cell kept or refilled tokens from the hour out", err, f.behind.count()-before)
	}
}

// A changed node count starts the share anew: its cells empty, refilling
// at the new rate. A share that grows gains nothing at once, so no node
// gains what others spent.
func TestNodeCountEmpties(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3, 0)
	f.hit(t, takeOf("a", 4)) // the cell (10) holds 6
	f.member.set(2, true)    // 15 tokens, all lacking
	if f.hit(t, takeOf("a", 1)); f.behind.count() != 1 {
		t.Fatal("n 3 → 2: a take fit the cell: it kept its tokens or gained the new ones")
	}
	f.clock.Advance(time.Minute) // 15 tokens a minute: full
	if f.hit(t, takeOf("a", 15)); f.behind.count() != 1 {
		t.Fatal("n 2, a minute later: the take of the cell's 15 went behind")
	}
	f.clock.Advance(time.Minute) // full again
	f.member.set(6, true)        // 5 tokens, all lacking from the next call on
	if f.hit(t, takeOf("a", 1)); f.behind.count() != 2 {
		t.Fatal("n 2 → 6: a take fit the cell")
	}
	f.clock.Advance(30 * time.Second)
	if _, st := f.hit(t, takeOf("a", 2)); f.behind.count() != 2 || st[0].Remaining != 0 {
		t.Errorf("n 6, 30 s later: %+v, %d calls behind; want the 2 tokens refilled at 5 a minute from the cell", st[0], f.behind.count())
	}
}

// A give fills its cell up to what it lacks and sends the rest to Redis'
// part.
func TestGives(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3, 0)
	f.hit(t, takeOf("a", 10))
	give := func(c uint64) bucket.Hit { h := takeOf("a", c); h.Give = true; return h }
	if d, st := f.hit(t, give(4)); !d.Allowed || st[0].Remaining != 4 || f.behind.count() != 0 {
		t.Fatalf("give 4 to a cell lacking 10: %+v %+v, %d calls behind; want the cell at 4, no call", d, st[0], f.behind.count())
	}
	f.hit(t, give(12))
	h := f.behind.last(t)
	if len(h) != 1 || !h[0].Give || h[0].Cost != 6 || h[0].Limit != redisPart {
		t.Errorf("give 12 to a cell lacking 6: behind got %+v, want a give of 6 at Redis' part", h)
	}
	if _, st := f.hit(t, takeOf("a", 10)); st[0].Remaining != 0 || f.behind.count() != 1 {
		t.Errorf("the cell does not hold its 10 tokens after the gives")
	}
}

// A check goes to Redis' part, where debt is kept, and reports both
// parts' tokens; a charge bypasses the cells at the whole limit.
func TestChecksAndCharges(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3, 0)
	d, st := f.hit(t, takeOf("a", 0))
	if h := f.behind.last(t); !d.Allowed || h[0].Limit != redisPart || h[0].Cost != 0 || st[0].Remaining != 40 {
		t.Errorf("check: %+v %+v, behind %+v; want allowed at Redis' part, 30 + 10 remaining", d, st[0], h)
	}
	charge := takeOf("c", 3)
	charge.Independent, charge.Overdraw = true, true
	f.hit(t, charge)
	if h := f.behind.last(t); h[0].Limit != perMinute || h[0].Cost != 3 {
		t.Errorf("charge: behind got %+v, want the whole limit", h)
	}
	if n := f.l.Len(); n != 0 {
		t.Errorf("%d cells after a check and a charge, want 0", n)
	}
}

// Independent hits (shadow mode) take from their cell, then from Redis'
// part, and keep their effect in a refused call.
func TestIndependent(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3, 0)
	shadow := takeOf("a", 8)
	shadow.Independent = true
	tight := bucket.Hit{Key: key("b"), Limit: bucket.Limit{Requests: 1, Period: time.Hour, Burst: 2}, Cost: 3}
	d, st := f.hit(t, shadow, tight)
	if d.Allowed || !st[0].Allowed || st[0].Remaining != 2 {
		t.Fatalf("call: %+v %+v; want refused by b, the shadow take from its cell, kept (2 left)", d, st)
	}
	d, st = f.hit(t, shadow)
	if h := f.behind.last(t); !d.Allowed || !st[0].Allowed || !h[0].Independent || h[0].Limit != redisPart {
		t.Errorf("shadow take beyond its cell: %+v %+v, behind %+v; want it at Redis' part", d, st[0], h)
	}
}

// A full table sends new keys to Redis' part, never to a fresh cell.
func TestFullTable(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3, 64)
	for i := range 1000 {
		if d, _ := f.hit(t, takeOf(fmt.Sprint("k", i), 1)); !d.Allowed {
			t.Fatalf("take %d refused", i)
		}
	}
	full := f.l.FullRefusals()
	if full == 0 || uint64(f.behind.count()) != full || f.l.Len() > 64 {
		t.Errorf("%d cells, %d refused for room, %d calls behind; want at most 64 cells and every refusal behind", f.l.Len(), full, f.behind.count())
	}
}

// Hits without a share pass behind as they are, in one call.
func TestNoShareUntouched(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3, 0)
	hits := []bucket.Hit{{Key: key("a"), Limit: perMinute, Cost: 2}, {Key: key("b"), Limit: perMinute, Cost: 1, Give: true}}
	f.hit(t, hits...)
	if h := f.behind.last(t); len(h) != 2 || h[0] != hits[0] || h[1] != hits[1] {
		t.Errorf("behind got %+v, want %+v", h, hits)
	}
}

// A hit whose rule sets no share has the layer's Default: none when 0
// (it passes behind untouched), else its cell decides it, as a rule with
// that share.
func TestDefaultShare(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3, 0)
	unset := takeOf("a", 1)
	unset.Rule = shareRule(0)
	f.hit(t, unset)
	if h := f.behind.last(t); len(h) != 1 || h[0] != unset {
		t.Fatalf("Default 0: behind got %+v, want %+v", h, unset)
	}
	l := share.New(share.Options{Inner: f.behind, Membership: f.member, Clock: f.clock, Default: half})
	f.held(l)
	st := make([]bucket.State, 1)
	if d, err := l.Hit(context.Background(), []bucket.Hit{unset}, st); err != nil || !d.Allowed || st[0].Remaining != 9 || f.behind.count() != 0 {
		t.Errorf("Default half: %+v %+v %v, %d calls behind; want it from a's cell of 10, 9 left", d, st[0], err, f.behind.count())
	}
}

// A changed limit converts the cell keeping what it lacks; a cost above
// the cell goes to Redis' part whole.
func TestLimitChangeAndLargeCost(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3, 0)
	f.hit(t, takeOf("a", 10))
	doubled := takeOf("a", 10)
	doubled.Limit.Requests, doubled.Limit.Burst = 120, 120 // cell 20, 10 lacking
	if d, st := f.hit(t, doubled); !d.Allowed || st[0].Remaining != 0 || f.behind.count() != 0 {
		t.Fatalf("limit doubled: %+v %+v, %d calls behind; want the 10 new tokens from the cell", d, st[0], f.behind.count())
	}
	big := takeOf("b", 15)
	if d, st := f.hit(t, big); !d.Allowed || st[0].Remaining != 15+10 {
		t.Errorf("a take of 15, above the cell's 10: %+v %+v; want it from Redis' part (15 left there, 10 in the cell)", d, st[0])
	}
	if h := f.behind.last(t); h[0].Cost != 15 || h[0].Limit != redisPart {
		t.Errorf("behind got %+v, want the take of 15 whole at Redis' part", h)
	}
}

// skipping answers Skipped (--redis-failure local while Redis fails).
type skipping struct{ bucket.Limiter }

func (skipping) Hit(context.Context, []bucket.Hit, []bucket.State) (bucket.Decision, error) {
	return bucket.Decision{Allowed: true, Answer: bucket.Skipped}, nil
}

// A call the layer behind skips is skipped whole: the cells' tokens go
// back. One whose takes all fit the cells is still decided by them.
func TestSkippedBehindGivesBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3, 0)
	l := share.New(share.Options{Inner: skipping{f.behind}, Membership: f.member, Clock: f.clock})
	f.held(l)
	hits := []bucket.Hit{takeOf("a", 4), {Key: key("b"), Limit: perMinute, Cost: 1}}
	st := make([]bucket.State, 2)
	if d, _ := l.Hit(context.Background(), hits, st); d.Answer != bucket.Skipped {
		t.Fatalf("decision %+v, want Skipped", d)
	}
	if d, _ := l.Hit(context.Background(), []bucket.Hit{takeOf("a", 10)}, st); d.Answer != bucket.Decided || !d.Allowed || st[0].Remaining != 0 {
		t.Errorf("the cell's 10 tokens: %+v %+v, want decided by the cell", d, st[0])
	}
}

// fallingBack answers as the fail-open switch does while Redis fails:
// decided, by its fallback.
type fallingBack struct{ bucket.Limiter }

func (f fallingBack) Hit(ctx context.Context, hits []bucket.Hit, states []bucket.State) (bucket.Decision, error) {
	d, err := f.Limiter.Hit(ctx, hits, states)
	d.Answer = bucket.Fallback
	return d, err
}

// While the layer behind answers from its fallback, the cells keep
// deciding what fits them, and the rest reports the fallback's answer.
func TestFallbackBehind(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3, 0)
	l := share.New(share.Options{Inner: fallingBack{f.behind}, Membership: f.member, Clock: f.clock})
	f.held(l)
	st := make([]bucket.State, 1)
	if d, _ := l.Hit(context.Background(), []bucket.Hit{takeOf("a", 10)}, st); d.Answer != bucket.Decided || !d.Allowed || f.behind.count() != 0 {
		t.Errorf("a take that fits: %+v, %d calls behind; want decided by the cell", d, f.behind.count())
	}
	if d, _ := l.Hit(context.Background(), []bucket.Hit{takeOf("a", 1)}, st); d.Answer != bucket.Fallback || !d.Allowed {
		t.Errorf("a take beyond the cell: %+v, want the fallback's answer", d)
	}
}

// A call decided by the cells allocates nothing.
func TestCellsDoNotAllocate(t *testing.T) {
	if raceDetector {
		t.Skip("the race detector allocates")
	}
	f := newFixture(t, 3, 0)
	hits := []bucket.Hit{takeOf("a", 1), takeOf("b", 1), takeOf("c", 1)}
	hits[0].Limit.Burst, hits[1].Limit.Burst, hits[2].Limit.Burst = 1<<40, 1<<40, 1<<40
	st := make([]bucket.State, 3)
	f.l.Hit(context.Background(), hits, st) // the cells exist, the pool holds a scratch
	if n := testing.AllocsPerRun(100, func() { f.l.Hit(context.Background(), hits, st) }); n != 0 {
		t.Errorf("a call decided by the cells allocates %v times, want 0", n)
	}
}

// A call whose gives need a second call of the cells keeps what the first
// one decided: its take, which fit, goes nowhere else.
func TestGivesKeepTheTakesDecided(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3, 0)
	f.hit(t, takeOf("a", 10))
	f.hit(t, takeOf("b", 10))
	give := func(k string) bucket.Hit { h := takeOf(k, 1); h.Give = true; return h }
	if d, st := f.hit(t, takeOf("c", 1), give("a"), give("b")); !d.Allowed || st[0].Remaining != 9 || f.behind.count() != 0 {
		t.Errorf("a take that fits and two gives the cells absorb: %+v %+v, %d calls behind; want all decided by the cells", d, st, f.behind.count())
	}
}

// watched is a Membership that counts its calls.
type watched struct {
	*members
	calls atomic.Int64
}

func (w *watched) ShareAt(now time.Time) (int, bool) {
	w.calls.Add(1)
	return w.members.ShareAt(now)
}

// Run looks at the membership, so a share starts when it is granted, not
// at the first call after: an hour later its cells are full.
func TestRunWatchesMembership(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3, 0)
	m := &watched{members: f.member}
	l := share.New(share.Options{Inner: f.behind, Membership: m, Clock: f.clock})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); l.Run(ctx) }()
	defer func() { cancel(); <-ran }()
	// Two looks: the first is done once the second is made.
	for want := int64(1); want <= 2; want++ {
		if err := f.clock.BlockUntilContext(ctx, 2); err != nil {
			t.Fatal(err)
		}
		f.clock.Advance(100 * time.Millisecond)
		for deadline := time.Now().Add(10 * time.Second); m.calls.Load() < want; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("Run looked at the membership %d times, want %d", m.calls.Load(), want)
			}
		}
	}
	f.clock.Advance(time.Hour)
	st := make([]bucket.State, 1)
	if d, _ := l.Hit(context.Background(), []bucket.Hit{takeOf("a", 10)}, st); !d.Allowed || f.behind.count() != 0 {
		t.Errorf("an hour after Run saw the share: %+v, %d calls behind; want the cell's 10 tokens", st[0], f.behind.count())
	}
}
