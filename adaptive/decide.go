package adaptive

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Reading is one signal's value at an evaluation; Err is set when there
// is none (the source failed, or the result was empty or not a number).
type Reading struct {
	Name  string
	Value float64
	Err   error
}

// valid reports whether r holds a usable number.
func (r Reading) valid() bool {
	return r.Err == nil && !math.IsNaN(r.Value) && !math.IsInf(r.Value, 0)
}

func (r Reading) String() string {
	if !r.valid() {
		if r.Err != nil {
			return r.Name + ": " + r.Err.Error()
		}
		return r.Name + "=" + strconv.FormatFloat(r.Value, 'g', -1, 64)
	}
	return r.Name + "=" + strconv.FormatFloat(r.Value, 'g', 6, 64)
}

// State is what a decision starts from.
type State struct {
	// Scale is the current scale; 1 when the policy's override is absent.
	Scale float64
	// LastChange is when the scale last changed; zero: not known to have.
	LastChange time.Time
	// LastGood is the last evaluation whose every signal was valid (or when
	// the controller started acting, before the first).
	LastGood time.Time
}

// Decision is the outcome of one evaluation.
type Decision struct {
	// Scale is the scale from now on (State.Scale when it holds).
	Scale float64
	// Reason says why, with the signal values: the audit reason of a change.
	Reason string
	// Good reports that every signal was valid.
	Good bool
}

// Decide evaluates p on readings (one per signal, in p's order; one for the
// proportional query) at now, from st. protected caps the scale at 1.
// Decide is pure: the controller applies its result.
func (p *Policy) Decide(st State, readings []Reading, now time.Time, protected bool) Decision {
	hi := p.MaxScale
	if protected {
		hi = min(hi, 1)
	}
	bound := func(v float64) float64 { return round(min(max(v, p.MinScale), hi)) }
	if b := bound(st.Scale); b != st.Scale {
		return Decision{Scale: b, Reason: fmt.Sprintf("scale %s outside its bounds [%s, %s]", num(st.Scale), num(p.MinScale), num(hi)), Good: allValid(readings)}
	}
	var missing []string
	for _, r := range readings {
		if !r.valid() {
			missing = append(missing, r.String())
		}
	}
	if len(missing) > 0 || len(readings) == 0 {
		why := "no signal (" + strings.Join(missing, "; ") + ")"
		if now.Sub(st.LastGood) >= p.StaleAfter && st.Scale != 1 {
			return Decision{Scale: 1, Reason: fmt.Sprintf("%s for %v: back to 1", why, now.Sub(st.LastGood).Round(time.Millisecond))}
		}
		return Decision{Scale: st.Scale, Reason: why + ": holding"}
	}
	target, why := p.target(st.Scale, readings)
	target = bound(target)
	switch {
	case target == st.Scale:
		return Decision{Scale: st.Scale, Reason: why + ": holding", Good: true}
	case now.Sub(st.LastChange) < p.Cooldown:
		return Decision{Scale: st.Scale, Reason: fmt.Sprintf("%s: cooldown until %s", why, st.LastChange.Add(p.Cooldown).UTC().Format(time.RFC3339Nano)), Good: true}
	}
	return Decision{Scale: target, Reason: fmt.Sprintf("%s: scale %s → %s", why, num(st.Scale), num(target)), Good: true}
}

// target is the scale the readings (all valid) ask for, unbounded, and why.
func (p *Policy) target(cur float64, readings []Reading) (float64, string) {
	if pr := p.Proportional; pr != nil {
		v := readings[0]
		t := v.Value / pr.Baseline
		why := fmt.Sprintf("%s over baseline %s = %s", v, num(pr.Baseline), num(round(t)))
		if math.Abs(t-cur) < pr.Tolerance {
			return cur, why + " (within tolerance " + num(pr.Tolerance) + ")"
		}
		return t, why
	}
	var above []string
	below := true
	for i, r := range readings {
		s := p.Signals[i]
		if r.Value > s.LowerAbove {
			above = append(above, fmt.Sprintf("%s above %s", r, num(s.LowerAbove)))
		}
		below = below && r.Value < s.RaiseBelow
	}
	vals := make([]string, len(readings))
	for i, r := range readings {
		vals[i] = r.String()
	}
	switch {
	case len(above) > 0:
		return snap(cur, cur*p.LowerFactor), strings.Join(above, ", ")
	case below:
		return snap(cur, cur*p.RaiseFactor), "every signal below its raise threshold (" + strings.Join(vals, ", ") + ")"
	}
	return cur, "between the thresholds (" + strings.Join(vals, ", ") + ")"
}

// snap stops a step that crosses 1 at 1: returning to the rule files'
// limits is a change of its own (a restore), whatever the factors.
func snap(cur, next float64) float64 {
	if cur < 1 && next > 1 || cur > 1 && next < 1 {
		return 1
	}
	return next
}

func allValid(rs []Reading) bool {
	for _, r := range rs {
		if !r.valid() {
			return false
		}
	}
	return len(rs) > 0
}

// round keeps four decimals, so repeated steps do not drift into noise.
func round(v float64) float64 { return math.Round(v*1e4) / 1e4 }

func num(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }
