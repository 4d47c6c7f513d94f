package adaptive

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 5, 3, 0, 0, 0, time.UTC)

// stepPolicy is the CPU-and-latency design: CPU > 0.8 or P99 > 1 s lowers
// × 0.8; CPU < 0.5 and P99 < 0.2 s raises × 1.1.
func stepPolicy() Policy {
	p := Policy{Name: "p", Domain: "edge", Signals: []Signal{
		{Name: "cpu", Query: "cpu", LowerAbove: 0.8, RaiseBelow: 0.5},
		{Name: "p99", Query: "p99", LowerAbove: 1, RaiseBelow: 0.2},
	}, MinScale: 0.5, MaxScale: 2}
	p.fill()
	return p
}

func readings(cpu, p99 float64) []Reading {
	return []Reading{{Name: "cpu", Value: cpu}, {Name: "p99", Value: p99}}
}

func TestDecideStep(t *testing.T) {
	t.Parallel()
	p := stepPolicy()
	long := t0.Add(-time.Hour) // a change long ago: no cooldown
	tests := []struct {
		name      string
		st        State
		r         []Reading
		protected bool
		want      float64
		why       string
	}{
		{"cpu high lowers", State{Scale: 1, LastChange: long, LastGood: t0}, readings(0.9, 0.1), false, 0.8, "cpu=0.9 above 0.8"},
		{"p99 high lowers", State{Scale: 0.8, LastChange: long, LastGood: t0}, readings(0.6, 1.5), false, 0.64, "p99=1.5 above 1"},
		{"both low raises", State{Scale: 0.8, LastChange: long, LastGood: t0}, readings(0.3, 0.1), false, 0.88, "every signal below"},
		{"one between holds", State{Scale: 0.8, LastChange: long, LastGood: t0}, readings(0.3, 0.5), false, 0.8, "between the thresholds"},
		{"raise stops at 1", State{Scale: 0.968, LastChange: long, LastGood: t0}, readings(0.3, 0.1), false, 1, "0.968 → 1"},
		{"lower stops at 1", State{Scale: 1.1, LastChange: long, LastGood: t0}, readings(0.9, 0.1), false, 1, "1.1 → 1"},
		{"raise above 1 up to max", State{Scale: 1.9, LastChange: long, LastGood: t0}, readings(0.3, 0.1), false, 2, "1.9 → 2"},
		{"never below min", State{Scale: 0.55, LastChange: long, LastGood: t0}, readings(0.9, 0.1), false, 0.5, "0.55 → 0.5"},
		{"at min holds", State{Scale: 0.5, LastChange: long, LastGood: t0}, readings(0.9, 0.1), false, 0.5, "holding"},
		{"cooldown holds", State{Scale: 1, LastChange: t0.Add(-p.Cooldown + time.Millisecond), LastGood: t0}, readings(0.9, 0.1), false, 1, "cooldown until"},
		{"cooldown over", State{Scale: 1, LastChange: t0.Add(-p.Cooldown), LastGood: t0}, readings(0.9, 0.1), false, 0.8, "1 → 0.8"},
		{"protected never above 1", State{Scale: 1, LastChange: long, LastGood: t0}, readings(0.3, 0.1), true, 1, "holding"},
		{"protected above 1 comes down", State{Scale: 1.5, LastChange: t0, LastGood: t0}, readings(0.3, 0.1), true, 1, "outside its bounds"},
		{"no signal holds", State{Scale: 0.8, LastChange: long, LastGood: t0.Add(-p.StaleAfter + time.Millisecond)},
			[]Reading{{Name: "cpu", Value: 0.9}, {Name: "p99", Err: errors.New("connection refused")}}, false, 0.8, "no signal (p99: connection refused): holding"},
		{"NaN holds", State{Scale: 0.8, LastChange: long, LastGood: t0}, readings(math.NaN(), 0.1), false, 0.8, "cpu=NaN"},
		{"no signal past stale_after returns to 1", State{Scale: 0.8, LastChange: t0, LastGood: t0.Add(-p.StaleAfter)},
			[]Reading{{Name: "cpu", Err: ErrEmpty}, {Name: "p99", Value: 0.1}}, false, 1, "back to 1"},
		{"stale at 1 holds", State{Scale: 1, LastChange: long, LastGood: long}, readings(math.Inf(1), 0.1), false, 1, "holding"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := p.Decide(tt.st, tt.r, t0, tt.protected)
			if d.Scale != tt.want || !strings.Contains(d.Reason, tt.why) {
				t.Errorf("Decide = %v (%q), want %v (%q)", d.Scale, d.Reason, tt.want, tt.why)
			}
		})
	}
}

func TestDecideProportional(t *testing.T) {
	t.Parallel()
	p := Policy{Name: "p", Domain: "edge", Proportional: &Proportional{Query: "up", Baseline: 4}, MaxScale: 1.5}
	p.fill()
	st := func(s float64) State { return State{Scale: s, LastGood: t0} }
	tests := []struct {
		st   State
		v    float64
		want float64
	}{
		{st(1), 3, 0.75},
		{st(1), 4, 1},
		{st(1), 3.9, 1},    // within the tolerance
		{st(0.75), 8, 1.5}, // bounded by max_scale
		{st(1), 0, 0.1},    // bounded by min_scale (the default)
	}
	for _, tt := range tests {
		d := p.Decide(tt.st, []Reading{{Name: "proportional", Value: tt.v}}, t0, false)
		if d.Scale != tt.want {
			t.Errorf("from %v with %v: %v (%s), want %v", tt.st.Scale, tt.v, d.Scale, d.Reason, tt.want)
		}
	}
}

func TestParse(t *testing.T) {
	t.Parallel()
	c, err := Parse([]byte(`
prometheus: http://127.0.0.1:9090
policies:
  - name: latency
    domain: edge
    rule: edge.user_id
    interval: 10s
    signals:
      - {name: p99, query: 'p99', lower_above: 1, raise_below: 0.2}
`))
	if err != nil {
		t.Fatal(err)
	}
	p := c.Policies[0]
	if p.LowerFactor != 0.8 || p.RaiseFactor != 1.1 || p.MinScale != DefaultMinScale || p.MaxScale != 1 || p.Cooldown != 20*time.Second || p.StaleAfter != 80*time.Second || c.LockTTL != DefaultLockTTL {
		t.Errorf("defaults not filled in: %+v, lock_ttl %v", p, c.LockTTL)
	}
	for _, tt := range []struct{ yaml, want string }{
		{`policies: []`, "prometheus: the http:// or https:// URL"},
		{"prometheus: 'http://u:secret@'\npolicies: []", `not "http://u:xxxxx@"`},
		{"prometheus: http://p\npolicies: [{name: a, domain: d}]", "give signals"},
		{"prometheus: http://p\npolicies: [{name: a, domain: d, signals: [{name: s, query: q, lower_above: 1, raise_below: 1}]}]", "raise_below (1) must be below lower_above (1)"},
		{"prometheus: http://p\npolicies: [{name: a, domain: d, lower_factor: 1.2, proportional: {query: q, baseline: 2}}]", "lower_factor must be above 0 and below 1"},
		{"prometheus: http://p\npolicies: [{name: a, domain: d, min_scale: -1, proportional: {query: q, baseline: 0}}]", "baseline must be above 0"},
		{"prometheus: http://p\npolicies: [{name: a, domain: d, max_scale: 5000, proportional: {query: q, baseline: 1}}]", "max_scale must be at least 1 and at most 1000"},
		{"prometheus: http://p\npolicies: [{name: a, domain: d, interval: 1ms, proportional: {query: q, baseline: 1}}]", "interval must be at least"},
		{"prometheus: http://p\npolicies: [{name: a, domain: d, proportional: {query: q, baseline: 1}}, {name: b, domain: d, proportional: {query: q, baseline: 1}}]", `scales the same scope as policy "a"`},
		{"prometheus: http://p\nunknown: 1", "field unknown not found"},
		{"prometheus: http://p\npolicies: [{name: 'a b', domain: d, proportional: {query: q, baseline: 1}}]", "name must be"},
	} {
		if _, err := Parse([]byte(tt.yaml)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", tt.yaml, err, tt.want)
		}
	}
}
