package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/descriptors"
)

// ErrUnknownDomain is Usage's error for a domain without rules.
var ErrUnknownDomain = errors.New("no rules for this domain")

// ErrBadUsage wraps Usage's errors for a request it cannot read: no
// domain, no descriptor, or one beyond the request-size limits.
var ErrBadUsage = errors.New("bad usage request")

// Usage is the answer of GET /usage: for each descriptor, its rule and
// the buckets it has in each layer, read without spending a token.
type Usage struct {
	Domain string `json:"domain"`
	// Gray is true when a descriptor carries the gray marker: the local
	// buckets read are the gray ones, with doubled limits.
	Gray        bool              `json:"gray,omitempty"`
	Descriptors []UsageDescriptor `json:"descriptors"`
}

// UsageDescriptor is one descriptor of a Usage answer.
type UsageDescriptor struct {
	// Descriptor is the descriptor as asked, "key=value,key=value".
	Descriptor string `json:"descriptor"`
	// Rule is the rule that limits it; nil when none does (no rule
	// matched, or another descriptor's rule replaces it).
	Rule *UsageRule `json:"rule,omitempty"`
	// Replaced names the rule that matched but that another descriptor's
	// rule of the same request replaces (rate_limit.replaces).
	Replaced  *UsageRule `json:"replaced,omitempty"`
	Unlimited bool       `json:"unlimited,omitempty"` // its rule is unlimited
	Shadow    bool       `json:"shadow,omitempty"`    // its rule is in shadow mode
	Quota     bool       `json:"quota,omitempty"`     // its rule is a quota
	// Layers lists its buckets: local, then global (or fallback).
	Layers []UsageLayer `json:"layers,omitempty"`
}

// UsageRule names a rule: its path (the metric label) and its name.
type UsageRule struct {
	Path string `json:"path"`
	Name string `json:"name,omitempty"`
}

// UsageLayer is one bucket of a descriptor, as one layer reports it.
type UsageLayer struct {
	// Layer is local (this node), global (Redis: the fleet; or memory
	// without Redis) or fallback (this node's share of the global limit,
	// while Redis fails).
	Layer string `json:"layer"`
	// Source says who answered: "memory (this node)", "redis (the
	// fleet)" or, while Redis fails, the fallback (this node's share of
	// the global limit, or --redis-failure deny).
	Source string `json:"source"`
	// NotEnforced, when set, says why the layer has no bucket to read now
	// (the other fields are then empty).
	NotEnforced string `json:"not_enforced,omitempty"`
	// Error is set when the layer could not answer.
	Error string     `json:"error,omitempty"`
	Limit UsageLimit `json:"limit"`
	// Remaining is the number of whole tokens left now.
	Remaining uint64 `json:"remaining"`
	// FullInMS is the time until the bucket is full again, in
	// milliseconds rounded up (0: full); FullIn is the same as a Go
	// duration ("1.5s").
	FullIn   string `json:"full_in"`
	FullInMS int64  `json:"full_in_ms"`
	// Share is this node's standing share of the bucket, for a global
	// bucket whose rule holds shares (rate_limit.share, --share); Limit
	// and Remaining are then Redis' part alone. Nil otherwise.
	Share *UsageShare `json:"share,omitempty"`
}

// UsageShare is this node's standing share of a global bucket: its cell,
// f/n of the rule's limit, decided on this node without Redis. The rule's
// limit is Redis' part plus one such cell per node.
type UsageShare struct {
	Fraction float64 `json:"fraction"` // f: the part of the limit held as shares
	// Nodes is n, the node count shares are sized by; 0 while this node
	// holds no share (the cell is then empty and Redis' part decides).
	Nodes int `json:"nodes"`
	// Limit is the cell's (f/n of the rule's); empty when the node holds
	// no share, or the share is less than a token.
	Limit     UsageLimit `json:"limit"`
	Remaining uint64     `json:"remaining"`
	FullIn    string     `json:"full_in"`
	FullInMS  int64      `json:"full_in_ms"`
}

// UsageLimit is a bucket's shape: RequestsPerUnit tokens per
// UnitMultiplier Units, Burst at most. A part of a limit (Redis' part or a
// share cell) may refill over a period that is no whole number of units:
// Unit is then empty and Period says it ("4m17.142857143s").
type UsageLimit struct {
	RequestsPerUnit uint64 `json:"requests_per_unit"`
	Unit            string `json:"unit,omitempty"` // second, minute, hour, day, week, month, year
	UnitMultiplier  uint32 `json:"unit_multiplier,omitempty"`
	Period          string `json:"period,omitempty"`
	Burst           uint64 `json:"burst"`
}

// Usage reads, for each descriptor of req, the buckets a request of it
// would be decided by, without taking a token: the keys are built exactly
// as ShouldRateLimit builds them (gray marker, digests of long values,
// share_threshold), and each layer is asked a check-only hit (bucket.Hit
// Cost 0, Independent), which reports a bucket's state and changes
// nothing. Its limit overrides, hits_addend and is_negative_hits are
// ignored. Errors: ErrBadUsage for an unreadable request, ErrUnknownDomain.
func (s *Server) Usage(ctx context.Context, req *rlsv3.RateLimitRequest) (*Usage, error) {
	if err := s.checkRequest(req); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadUsage, err)
	}
	dom := s.opts.Rules.Rules().Domain(req.GetDomain())
	if dom == nil {
		return nil, fmt.Errorf("domain %q: %w", req.GetDomain(), ErrUnknownDomain)
	}
	// A copy without overrides: the rules' buckets are the ones asked for.
	plain := &rlsv3.RateLimitRequest{Domain: req.GetDomain()}
	for _, d := range req.GetDescriptors() {
		plain.Descriptors = append(plain.Descriptors, &commonv3.RateLimitDescriptor{Entries: d.GetEntries()})
	}
	sc := new(scratch) // not pooled: /usage is rare, and keeps nothing
	gray := s.isGray(plain)
	s.match(sc, dom, plain)
	s.buildHits(sc, plain, gray)
	checkOnly(sc.local)
	checkOnly(sc.global)
	u := &Usage{Domain: dom.Name, Gray: gray}
	local := s.readLayer(ctx, s.opts.Local, sc.local, LayerLocal)
	var global layerRead
	if s.opts.Global != nil {
		global = s.readLayer(ctx, s.opts.Global, sc.global, LayerGlobal)
	}
	for i, d := range plain.GetDescriptors() {
		ds := &sc.descs[i]
		ud := UsageDescriptor{Descriptor: descriptorText(d), Unlimited: ds.unlimited, Shadow: ds.shadow, Quota: ds.quota && ds.rule != nil}
		if ds.rule != nil {
			ud.Rule = &UsageRule{Path: ds.rule.Path, Name: ds.rule.Name}
		} else if r := s.replacedRule(dom, d); r != nil {
			ud.Replaced = &UsageRule{Path: r.Path, Name: r.Name}
		}
		if ds.local != none {
			ud.Layers = append(ud.Layers, local.layer(sc.local[ds.local], ds.local))
		}
		if ds.global != none && s.opts.Global != nil {
			ud.Layers = append(ud.Layers, global.layer(sc.global[ds.global], ds.global))
		}
		u.Descriptors = append(u.Descriptors, ud)
	}
	return u, nil
}

// replacedRule returns the rule d matches on its own, marker entries
// (gray, emergency) stripped as match strips them; Usage calls it for a
// descriptor left without a rule, which then has one only when another
// rule replaced it.
func (s *Server) replacedRule(dom *descriptors.Domain, d *commonv3.RateLimitDescriptor) *descriptors.Rule {
	var entries []descriptors.Entry
	for _, e := range d.GetEntries() {
		if !s.marker(e.GetKey()) {
			entries = append(entries, descriptors.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
	}
	if len(entries) == 0 {
		return nil
	}
	return dom.Match(entries)
}

// checkOnly turns hits into check-only ones: Cost 0 takes nothing, and
// Independent keeps one empty bucket from refusing the others' reading
// (and makes backend/redis ask Redis, not its cache of empty buckets, so
// the answer is the fleet's).
func checkOnly(hits []bucket.Hit) {
	for i := range hits {
		hits[i].Cost, hits[i].Give, hits[i].Independent, hits[i].Overdraw = 0, false, true, false
	}
}

// fallbackSource is the Source of a layer the fail-open switch answered.
const fallbackSource = "fallback (Redis is failing: this node's share of the global limit, or --redis-failure deny)"

// shareReader is a global layer holding standing shares (backend/share):
// Usage reads Redis' part and this node's share cell apart.
type shareReader interface {
	// ReadShares answers check-only hits as Hit does, shares[i] the
	// hit's share in millionths (0: none), states[i] Redis' part alone,
	// hits[i].Limit set to it, and cells[i] and cellStates[i] this node's
	// cell (Burst 0: none); n is the node count shares are sized by, 0
	// while the node holds none.
	ReadShares(ctx context.Context, hits []bucket.Hit, states []bucket.State, shares []uint32, cells []bucket.Limit, cellStates []bucket.State) (n int, d bucket.Decision, err error)
}

// layerRead is one layer's answer to the check-only hits of a Usage.
type layerRead struct {
	name        string // layer name
	source      string
	notEnforced string
	err         error
	states      []bucket.State
	// With standing shares (nil cells without): each hit's share in
	// millionths, its cell and the cell's state, and n.
	shares     []uint32
	cells      []bucket.Limit
	cellStates []bucket.State
	nodes      int
}

// readLayer asks lim for the states of hits (check-only).
func (s *Server) readLayer(ctx context.Context, lim bucket.Limiter, hits []bucket.Hit, layer Layer) layerRead {
	r := layerRead{name: layer.String(), source: "memory (this node)"}
	if layer == LayerGlobal && s.sharedKeys {
		r.source = "redis (the fleet)"
	}
	if len(hits) == 0 {
		return r
	}
	r.states = make([]bucket.State, len(hits))
	var d bucket.Decision
	var err error
	if sr, ok := lim.(shareReader); ok && layer == LayerGlobal {
		r.shares, r.cells, r.cellStates = make([]uint32, len(hits)), make([]bucket.Limit, len(hits)), make([]bucket.State, len(hits))
		r.nodes, d, err = sr.ReadShares(ctx, hits, r.states, r.shares, r.cells, r.cellStates)
	} else {
		d, err = lim.Hit(ctx, hits, r.states)
	}
	switch {
	case err != nil:
		r.err = err
	case d.Answer == bucket.Fallback:
		r.name, r.source = LayerFallback.String(), fallbackSource
	case d.Answer == bucket.Skipped:
		r.notEnforced = "the node is in fallback and --redis-failure local skips the global layer"
	case d.Answer == bucket.Bypassed:
		r.notEnforced = "the node is in fallback and --redis-failure allow lets every request through"
	}
	return r
}

// layer describes hit's bucket (at index i of the layer's hits).
func (r layerRead) layer(h bucket.Hit, i int) UsageLayer {
	ul := UsageLayer{Layer: r.name, Source: r.source, NotEnforced: r.notEnforced, Limit: usageLimit(h.Limit)}
	if r.cells != nil && r.shares[i] > 0 {
		us := &UsageShare{Fraction: float64(r.shares[i]) / 1e6, Nodes: r.nodes}
		if r.cells[i].Burst > 0 {
			us.Limit = usageLimit(r.cells[i])
		}
		us.Remaining, us.FullInMS, us.FullIn = reading(r.cellStates[i])
		ul.Share = us
	}
	if r.err != nil {
		ul.Error = r.err.Error()
		return ul
	}
	if r.notEnforced != "" {
		return ul
	}
	ul.Remaining, ul.FullInMS, ul.FullIn = reading(r.states[i])
	return ul
}

// usageLimit describes lim.
func usageLimit(lim bucket.Limit) UsageLimit {
	ul := UsageLimit{RequestsPerUnit: lim.Requests, Burst: lim.Burst}
	switch unit, mult := responseUnit(lim.Period); {
	case unit == rlsv3.RateLimitResponse_RateLimit_UNKNOWN:
		ul.Period = lim.Period.String()
	case mult > 1:
		ul.UnitMultiplier = mult
		fallthrough
	default:
		ul.Unit = strings.ToLower(unit.String())
	}
	return ul
}

// reading returns a bucket's tokens left and its time until full, in
// milliseconds rounded up and as a Go duration.
func reading(st bucket.State) (uint64, int64, string) {
	ms := ceilDiv(st.ResetAfter, time.Millisecond)
	return st.Remaining, ms, (time.Duration(ms) * time.Millisecond).String()
}

// descriptorText writes d's entries as "key=value,key=value".
func descriptorText(d *commonv3.RateLimitDescriptor) string {
	var b strings.Builder
	for i, e := range d.GetEntries() {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e.GetKey())
		b.WriteByte('=')
		b.WriteString(e.GetValue())
	}
	return b.String()
}

// ParseDescriptor reads a descriptor written "key=value[,key=value]...",
// as rls check, rls usage and GET /usage take them: entries are split at
// commas, and each at its first "=" (a value may hold "=", not ",").
func ParseDescriptor(text string) (*commonv3.RateLimitDescriptor, error) {
	d := &commonv3.RateLimitDescriptor{}
	for _, pair := range strings.Split(text, ",") {
		k, v, ok := strings.Cut(pair, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("descriptor %q: want KEY=VALUE[,KEY=VALUE]", text)
		}
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return d, nil
}

// UsageHandler serves GET /usage?domain=D&descriptor=k=v,k2=v2 (the
// descriptor parameter repeated, one per descriptor): the Usage answer as
// JSON. It spends no token. 400 for a request it cannot read (no domain,
// no descriptor, a malformed one, beyond the request-size limits), 404
// for a domain without rules, 405 for a method other than GET or HEAD.
func (s *Server) UsageHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "GET /usage?domain=D&descriptor=KEY=VALUE[,KEY=VALUE]...", http.StatusMethodNotAllowed)
			return
		}
		q := r.URL.Query()
		req := &rlsv3.RateLimitRequest{Domain: q.Get("domain")}
		if req.Domain == "" {
			http.Error(w, "missing domain: GET /usage?domain=D&descriptor=KEY=VALUE[,KEY=VALUE]...", http.StatusBadRequest)
			return
		}
		texts := q["descriptor"]
		if len(texts) == 0 {
			http.Error(w, "missing descriptor: give one descriptor=KEY=VALUE[,KEY=VALUE]... parameter per descriptor", http.StatusBadRequest)
			return
		}
		if len(texts) > s.opts.MaxDescriptors {
			http.Error(w, fmt.Sprintf("%d descriptors, more than the limit of %d", len(texts), s.opts.MaxDescriptors), http.StatusBadRequest)
			return
		}
		for _, text := range texts {
			d, err := ParseDescriptor(text)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			req.Descriptors = append(req.Descriptors, d)
		}
		u, err := s.Usage(r.Context(), req)
		switch {
		case errors.Is(err, ErrUnknownDomain):
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		case err != nil:
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		writeJSON(w, u)
	})
}

// writeJSON answers v as indented JSON with status 200.
func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		http.Error(w, "encoding answer: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}
