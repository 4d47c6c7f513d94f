package fallback_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/fallback"
)

// The stall rule of the tests: a stall is suspected after 30ms of timeouts
// without a success (as rls serve sets it for --redis-timeout 10ms), and
// confirmed by a probe with a 250ms deadline (rls serve: 1 s).
const (
	stallAfter = 30 * time.Millisecond
	confirm    = 250 * time.Millisecond
	callTime   = 10 * time.Millisecond // one timed-out call
)

// stallRig is a rig with the stall rule above and metrics in reg.
func stallRig(t *testing.T) (*rig, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	r := newRig(t, fallback.Share, func(o *fallback.Options) {
		o.StallAfter, o.Confirm = stallAfter, confirm
		o.Metrics = fallback.NewMetrics(reg, []string{"other"})
	})
	return r, reg
}

// counter returns the value of the counter name{label=value} in reg.
func counter(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{%s=%q}", name, label, value)
	return 0
}

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("%s: not within 10s", what)
		}
	}
}

// receive waits for a probe call, failing the test after 10 s.
func (r *rig) receive(t *testing.T, what string) {
	t.Helper()
	select {
	case <-r.probes:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no probe within 10s", what)
	}
}

// TestOneSlowMomentDoesNotSwitch: a call that times out when none has
// succeeded for longer than StallAfter (a starved CPU on a quiet node) is
// answered from the node's share and does not switch it while a probe
// finds Redis answering; the next request goes to Redis again.
func TestOneSlowMomentDoesNotSwitch(t *testing.T) {
	r, reg := stallRig(t)
	r.up.Store(true)
	if d := r.hit(t); d.Answer != bucket.Decided {
		t.Fatalf("Redis up: %+v, want Decided", d)
	}
	r.clock.Advance(time.Second) // a quiet node: no call for a second
	r.p.slow.Store(true)
	// Answered from the share, which the node spent through Redis (its one
	// token): refused, not allowed on top of Redis' count.
	if d := r.hit(t); d.Answer != bucket.Fallback || d.Allowed {
		t.Errorf("the timed-out request: %+v, want refused by the spent share (Fallback)", d)
	}
	if r.sw.Active() {
		t.Fatal("one timed-out call switched the node to fallback")
	}
	r.receive(t, "the suspected stall")
	waitFor(t, "the probe's answer counted", func() bool {
		return counter(t, reg, "ratelimit_fallback_stall_probes_total", "result", "up") == 1
	})
	if r.sw.Active() {
		t.Fatal("switched to fallback although the probe answered")
	}
	r.p.slow.Store(false)
	calls := r.p.calls.Load()
	if d := r.hit(t); d.Answer != bucket.Decided || r.p.calls.Load() != calls+1 {
		t.Errorf("the next request: %+v, primary calls +%d, want Decided by Redis", d, r.p.calls.Load()-calls)
	}
	// The probe's answer forgot the timeouts: a new one within StallAfter
	// neither switches nor probes.
	r.p.slow.Store(true)
	r.clock.Advance(callTime)
	r.hit(t)
	select {
	case <-r.probes:
		t.Error("a timeout 10ms after a probe answered probed again")
	default:
	}
	if v := counter(t, reg, "ratelimit_fallback_transitions_total", "to", "fallback"); v != 0 {
		t.Errorf("transitions to fallback %v, want 0", v)
	}
}

// TestStalledRedisSwitches: timeouts that keep coming while the probe finds
// no answer either switch the node when the probe's deadline passes: at
// most StallAfter + Confirm after the first timeout (280ms here; 1.03 s
// with rls serve's defaults, whose probe waits 1 s).
// Until then every call still goes to Redis and timed-out ones are
// answered from the share. The probe then brings the node back as before.
func TestStalledRedisSwitches(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, reg := stallRig(t)
	r.hit(t)
	r.p.slow.Store(true)
	r.hang.Store(true)
	start := r.clock.Now()
	for r.clock.Since(start) < stallAfter {
		r.clock.Advance(callTime)
		if d := r.hit(t); d.Answer != bucket.Fallback {
			t.Fatalf("timed-out request %v into the stall: %+v, want from the share", r.clock.Since(start), d)
		}
	}
	r.receive(t, "timeouts for StallAfter")
	if err := r.clock.BlockUntilContext(ctx, 1); err != nil { // the probe's deadline
		t.Fatal(err)
	}
	for r.clock.Since(start) < stallAfter+confirm-callTime {
		r.clock.Advance(callTime)
		calls := r.p.calls.Load()
		r.hit(t)
		if r.sw.Active() || r.p.calls.Load() != calls+1 {
			t.Fatalf("%v into the stall, before the probe's deadline: Active %v, Redis called %d times, want on Redis",
				r.clock.Since(start), r.sw.Active(), r.p.calls.Load()-calls)
		}
	}
	r.clock.Advance(callTime) // the probe's deadline passes
	waitFor(t, "the switch after the probe failed", r.sw.Active)
	if took := r.clock.Since(start); took > stallAfter+confirm {
		t.Errorf("switched %v after the first timeout, want within StallAfter + Confirm = %v", took, stallAfter+confirm)
	}
	if v := counter(t, reg, "ratelimit_fallback_stall_probes_total", "result", "down"); v != 1 {
		t.Errorf(`stall probes {result="down"} %v, want 1`, v)
	}
	calls := r.p.calls.Load()
	if d := r.hit(t); d.Answer != bucket.Fallback || r.p.calls.Load() != calls {
		t.Errorf("in fallback: %+v, Redis called %d times, want the share and no call", d, r.p.calls.Load()-calls)
	}

	// Recovery as before: the probe, 50ms later, finds Redis answering.
	r.hang.Store(false)
	r.up.Store(true)
	r.p.slow.Store(false)
	if err := r.clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatal(err)
	}
	r.clock.Advance(50 * time.Millisecond)
	r.receive(t, "the recovery probe")
	waitFor(t, "the switch back", func() bool { return !r.sw.Active() })
	if d := r.hit(t); d.Answer != bucket.Decided {
		t.Errorf("after recovery: %+v, want Decided by Redis", d)
	}
	if v := counter(t, reg, "ratelimit_fallback_transitions_total", "to", "redis"); v != 1 {
		t.Errorf("transitions to redis %v, want 1", v)
	}
}

// TestDeadRedisSwitchesAtOnce: an error other than a timeout (refused or
// broken connection, script error) switches the node on the first failed
// call, with no probe first.
func TestDeadRedisSwitchesAtOnce(t *testing.T) {
	r, reg := stallRig(t)
	r.hit(t)
	r.p.down.Store(true)
	if d := r.hit(t); d.Answer != bucket.Fallback {
		t.Errorf("the failed request: %+v, want from the share", d)
	}
	if !r.sw.Active() {
		t.Fatal("a connection error did not switch the node at once")
	}
	if v := counter(t, reg, "ratelimit_fallback_stall_probes_total", "result", "down"); v != 0 {
		t.Errorf("stall probes %v, want none for a connection error", v)
	}
}

// TestCloseEndsTheStallProbe: Close ends a probe still waiting for its
// deadline, and no switch follows.
func TestCloseEndsTheStallProbe(t *testing.T) {
	r, _ := stallRig(t)
	r.hit(t)
	r.p.slow.Store(true)
	r.hang.Store(true)
	r.clock.Advance(time.Second)
	r.hit(t)
	r.receive(t, "the suspected stall")
	r.sw.Close()
	if r.sw.Active() {
		t.Error("switched to fallback after Close")
	}
}

// TestStallProbeTimeoutAmidSuccesses: the probe timing out does not switch
// the node when calls succeeded meanwhile — the CPU was starved, Redis
// answered — and the node stays on Redis.
func TestStallProbeTimeoutAmidSuccesses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, reg := stallRig(t)
	r.hit(t)
	r.p.slow.Store(true)
	r.hang.Store(true)
	r.clock.Advance(time.Second)
	r.hit(t)
	r.receive(t, "the suspected stall")
	if err := r.clock.BlockUntilContext(ctx, 1); err != nil { // the probe's deadline
		t.Fatal(err)
	}
	r.p.slow.Store(false)
	r.clock.Advance(callTime)
	if d := r.hit(t); d.Answer != bucket.Decided {
		t.Fatalf("a call during the probe: %+v, want Decided", d)
	}
	r.clock.Advance(confirm)
	waitFor(t, "the probe's end counted", func() bool {
		return counter(t, reg, "ratelimit_fallback_stall_probes_total", "result", "up") == 1
	})
	if r.sw.Active() {
		t.Error("switched to fallback although a call succeeded while the probe waited")
	}
}
