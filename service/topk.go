package service

import (
	"cmp"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-rls/sluice/descriptors"
)

// Defaults of the top-K of refused values (Options.TopRefused).
const (
	// DefaultTopRefused is rls serve's --top-refused: counters per rule
	// and minute.
	DefaultTopRefused = 32
	// DefaultTopRefusedRules caps the rules tracked (Options.TopRefusedRules).
	DefaultTopRefusedRules = 128
	// TopRefusedMinutes is how many one-minute windows are kept: /usage/top
	// answers for the last 1 to TopRefusedMinutes minutes.
	TopRefusedMinutes = 5
)

// topWindow is the width of one window of the top-K.
const topWindow = time.Minute

// spaceSaving is the Space-Saving summary (Metwally, Agrawal and El Abbadi,
// "Efficient computation of frequent and top-k elements in data streams",
// 2005) of one window's refusals of one rule, in at most k counters.
//
// A value already counted is incremented. A new value takes a free counter
// at 1, or, when all k are in use, replaces the value of the smallest
// counter m and counts m+1, remembering m as its error. So every count is
// an upper bound (never below the value's true count, at most its error
// above it), the smallest counter is at most n/k for n refusals (the k
// counters sum to n), and a value refused more than n/k times holds a
// counter. Chosen over Misra–Gries, which has the same memory and bound,
// because its counts are upper bounds with a per-value error, so an answer
// can say how far each count may be off, and the top of the list is not
// worn down by the flood of one-off values.
//
// Written here rather than taken from a library: the Go ones known
// (dgryski/go-topk, unmaintained) neither split time into windows on an
// injected clock nor merge windows with the error kept. The smallest
// counter is found by a scan of the k counters, only when a new value
// arrives on a full summary; for k of tens that beats keeping a heap or
// the paper's stream-summary lists in order on every refusal.
type spaceSaving struct {
	items []topItem
	index map[string]int // value → position in items
	n     uint64         // refusals counted
}

// topItem is one counter of a spaceSaving summary.
type topItem struct {
	value      string
	count, err uint64
}

// add counts one refusal of value (a key built by the caller, copied only
// when it takes a counter).
func (s *spaceSaving) add(value []byte, k int) {
	s.n++
	if i, ok := s.index[string(value)]; ok {
		s.items[i].count++
		return
	}
	if len(s.items) < k {
		v := string(value)
		s.index[v] = len(s.items)
		s.items = append(s.items, topItem{value: v, count: 1})
		return
	}
	m := 0
	for i := range s.items {
		if s.items[i].count < s.items[m].count {
			m = i
		}
	}
	low := s.items[m].count
	delete(s.index, s.items[m].value)
	v := string(value)
	s.items[m] = topItem{value: v, count: low + 1, err: low}
	s.index[v] = m
}

// floor is the most refusals a value without a counter may have had: the
// smallest counter of a full summary, 0 otherwise.
func (s *spaceSaving) floor(k int) uint64 {
	if len(s.items) < k {
		return 0
	}
	low := s.items[0].count
	for _, it := range s.items[1:] {
		low = min(low, it.count)
	}
	return low
}

// ruleTop is the top-K of one rule: a ring of one-minute windows.
type ruleTop struct {
	mu      sync.Mutex
	windows [TopRefusedMinutes]struct {
		minute int64 // the window's minute since the Unix epoch; 0: unused
		ss     spaceSaving
	}
}

// topKey names a rule in the top-K.
type topKey struct{ domain, rule string }

// topRefused keeps a bounded top-K of refused values per rule. It is fed
// only on the refusal path, so an allowed request never touches it.
type topRefused struct {
	k, maxRules int
	mu          sync.RWMutex
	rules       map[topKey]*ruleTop
	untracked   atomic.Uint64 // refusals of rules beyond maxRules
}

func newTopRefused(k, maxRules int) *topRefused {
	if k <= 0 {
		return nil
	}
	if maxRules <= 0 {
		maxRules = DefaultTopRefusedRules
	}
	return &topRefused{k: k, maxRules: maxRules, rules: make(map[topKey]*ruleTop)}
}

// rule returns the top-K of a rule, adding it when there is room; nil
// when there is none. A full table first drops the rules without a
// refusal in the windows kept (rules gone with a reload, or quiet ones).
func (t *topRefused) rule(minute int64, domain, path string) *ruleTop {
	key := topKey{domain, path}
	t.mu.RLock()
	r := t.rules[key]
	t.mu.RUnlock()
	if r != nil {
		return r
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if r = t.rules[key]; r != nil {
		return r
	}
	if len(t.rules) >= t.maxRules {
		for k, old := range t.rules {
			if old.quietSince(minute) {
				delete(t.rules, k)
			}
		}
	}
	if len(t.rules) < t.maxRules {
		r = new(ruleTop)
		t.rules[key] = r
	}
	return r
}

// quietSince reports whether r counted nothing in the windows kept at
// minute.
func (r *ruleTop) quietSince(minute int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.windows {
		if w := &r.windows[i]; w.minute > minute-TopRefusedMinutes && w.ss.n > 0 {
			return false
		}
	}
	return true
}

// add counts one refusal of value for a rule at now.
func (t *topRefused) add(now time.Time, domain, path string, value []byte) {
	minute := now.UnixNano() / int64(topWindow)
	r := t.rule(minute, domain, path)
	if r == nil {
		t.untracked.Add(1)
		return
	}
	r.mu.Lock()
	w := &r.windows[minute%TopRefusedMinutes]
	if w.minute != minute {
		w.minute = minute
		w.ss.n = 0
		w.ss.items = w.ss.items[:0]
		if w.ss.index == nil {
			w.ss.index = make(map[string]int, t.k)
		}
		clear(w.ss.index)
	}
	w.ss.add(value, t.k)
	r.mu.Unlock()
}

// noteRefusals counts, in the top-K, each descriptor of a refused request
// whose status says OVER_LIMIT: its entries (gray ones removed, long
// values already digested) as "key=value,key=value", or the digest of
// that when it is longer than MaxValueBytes.
func (s *Server) noteRefusals(sc *scratch, out *outcome, resp *rlsv3.RateLimitResponse) {
	if s.top == nil {
		return
	}
	now := s.clock.Now()
	var buf [256]byte
	for i, st := range resp.GetStatuses() {
		if st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			continue
		}
		ds := &sc.descs[i]
		path := overrideRule
		if ds.rule != nil {
			path = ds.rule.Path
		}
		value := appendEntries(buf[:0], sc.entries[ds.start:ds.end])
		if len(value) > s.opts.MaxValueBytes {
			value = []byte(digest(string(value)))
		}
		s.top.add(now, out.domain, path, value)
	}
}

// appendEntries appends entries as "key=value,key=value".
func appendEntries(b []byte, entries []descriptors.Entry) []byte {
	for j, e := range entries {
		if j > 0 {
			b = append(b, ',')
		}
		b = append(b, e.Key...)
		b = append(b, '=')
		b = append(b, e.Value...)
	}
	return b
}

// TopRefusedRule is one rule of a TopRefused answer.
type TopRefusedRule struct {
	Domain string `json:"domain"`
	Rule   string `json:"rule"` // the rule's path; "_override" for Envoy's limit overrides
	// Refusals is how many refused descriptors of the rule the windows
	// counted (N).
	Refusals uint64 `json:"refusals"`
	// MaxError bounds how far any count is above the truth: the sum of
	// each window's smallest counter, at most Refusals/K. Every value
	// refused more than MaxError times is listed.
	MaxError uint64 `json:"max_error"`
	// Values are the tracked values, most refused first.
	Values []TopRefusedValue `json:"values"`
}

// TopRefusedValue is one value of a TopRefusedRule: it was refused at
// least AtLeast and at most Count times in the windows answered.
type TopRefusedValue struct {
	Value   string `json:"value"`
	Count   uint64 `json:"count"`
	AtLeast uint64 `json:"at_least"`
}

// TopRefusedAnswer is the answer of GET /usage/top.
type TopRefusedAnswer struct {
	K       int `json:"k"`       // counters per rule and minute (--top-refused)
	Minutes int `json:"minutes"` // the windows answered: the last Minutes minutes, this one included
	// Untracked counts refusals not tracked because TopRefusedRules rules
	// with refusals in the last TopRefusedMinutes were already (since the
	// start).
	Untracked uint64           `json:"untracked_refusals,omitempty"`
	Rules     []TopRefusedRule `json:"rules"`
}

// TopRefused answers the top-K of refused values over the last minutes
// one-minute windows (1 to TopRefusedMinutes; the current, partial minute
// is one of them), for every rule tracked, or only those of domain and
// rule when not empty. ok is false when the top-K is off.
func (s *Server) TopRefused(domain, rule string, minutes int) (ans TopRefusedAnswer, ok bool) {
	t := s.top
	if t == nil {
		return ans, false
	}
	minutes = min(max(minutes, 1), TopRefusedMinutes)
	ans = TopRefusedAnswer{K: t.k, Minutes: minutes, Untracked: t.untracked.Load(), Rules: []TopRefusedRule{}}
	t.mu.RLock()
	keys := make([]topKey, 0, len(t.rules))
	tops := make([]*ruleTop, 0, len(t.rules))
	for key, r := range t.rules {
		if (domain == "" || key.domain == domain) && (rule == "" || key.rule == rule) {
			keys, tops = append(keys, key), append(tops, r)
		}
	}
	t.mu.RUnlock()
	now := s.clock.Now().UnixNano() / int64(topWindow)
	for i, r := range tops {
		tr := r.merge(now, minutes, t.k)
		if tr.Refusals == 0 {
			continue
		}
		tr.Domain, tr.Rule = keys[i].domain, keys[i].rule
		ans.Rules = append(ans.Rules, tr)
	}
	slices.SortFunc(ans.Rules, func(a, b TopRefusedRule) int {
		return cmp.Or(cmp.Compare(b.Refusals, a.Refusals), cmp.Compare(a.Domain, b.Domain), cmp.Compare(a.Rule, b.Rule))
	})
	return ans, true
}

// merge sums the windows of the last minutes ending at minute now. A value
// a window does not track may have had up to that window's floor there:
// it is added to the value's count and to its error, so counts stay upper
// bounds and the errors add up to at most N/k (the sum of the windows'
// n/k).
func (r *ruleTop) merge(now int64, minutes, k int) TopRefusedRule {
	r.mu.Lock()
	defer r.mu.Unlock()
	type acc struct{ count, err uint64 }
	var (
		tr     TopRefusedRule
		floors uint64
		vals   = map[string]*acc{}
		live   []int
	)
	for i := range r.windows {
		w := &r.windows[i]
		if w.minute == 0 || w.minute > now || w.minute <= now-int64(minutes) {
			continue
		}
		live = append(live, i)
		tr.Refusals += w.ss.n
		floors += w.ss.floor(k)
		for _, it := range w.ss.items {
			a := vals[it.value]
			if a == nil {
				a = new(acc)
				vals[it.value] = a
			}
			a.count += it.count
			a.err += it.err
		}
	}
	tr.MaxError = floors
	for v, a := range vals {
		for _, i := range live {
			ss := &r.windows[i].ss
			if _, ok := ss.index[v]; !ok {
				f := ss.floor(k)
				a.count += f
				a.err += f
			}
		}
		tr.Values = append(tr.Values, TopRefusedValue{Value: v, Count: a.count, AtLeast: a.count - a.err})
	}
	slices.SortFunc(tr.Values, func(a, b TopRefusedValue) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Value, b.Value))
	})
	return tr
}

// TopRefusedHandler serves GET /usage/top[?domain=D][&rule=PATH][&minutes=M]:
// the TopRefused answer as JSON (minutes defaults to TopRefusedMinutes).
// 404 when the top-K is off (Options.TopRefused 0), 400 for a bad minutes.
func (s *Server) TopRefusedHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "GET /usage/top[?domain=D][&rule=PATH][&minutes=M]", http.StatusMethodNotAllowed)
			return
		}
		q := r.URL.Query()
		minutes := TopRefusedMinutes
		if m := q.Get("minutes"); m != "" {
			n, err := strconv.Atoi(m)
			if err != nil || n < 1 || n > TopRefusedMinutes {
				http.Error(w, fmt.Sprintf("minutes=%q: want a whole number from 1 to %d", m, TopRefusedMinutes), http.StatusBadRequest)
				return
			}
			minutes = n
		}
		ans, ok := s.TopRefused(q.Get("domain"), q.Get("rule"), minutes)
		if !ok {
			http.Error(w, "the top refused values are not kept (rls serve --top-refused 0)", http.StatusNotFound)
			return
		}
		writeJSON(w, ans)
	})
}
