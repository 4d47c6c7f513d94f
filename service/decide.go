package service

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/override"
)

// none marks a descriptor without a hit in a layer.
const none = -1

// descState is what the decision knows about one request descriptor.
type descState struct {
	rule       *descriptors.Rule
	start, end int // its entries, gray entries removed, in scratch.entries
	local      int // index into scratch.local, or none
	global     int // index into scratch.global, or none
	limit      bucket.Limit
	name       string // current_limit.name
	unlimited  bool   // matched an unlimited rule
	shadow     bool   // its rule's shadow_mode applies: a refusal answers OK
	quota      bool   // a quota: refuses the request only with every other quota
	postpaid   bool   // charged past its limit, into debt (rule.Postpaid; quotas are)
	override   bool   // limited by Envoy's limit override, not by its rule
}

// scratch holds one request's working buffers. Servers pool them so that a
// decision allocates nothing but its response.
type scratch struct {
	entries      []descriptors.Entry
	descs        []descState
	local        []bucket.Hit
	localStates  []bucket.State
	global       []bucket.Hit
	globalStates []bucket.State
	refund       []bucket.Hit
	keyBuf       []byte
	quotas       int             // descriptors with ds.quota
	postpaids    int             // descriptors with ds.postpaid but not ds.quota
	overrides    *override.Table // the request's runtime overrides; nil: none
}

func (sc *scratch) reset() {
	sc.entries = sc.entries[:0]
	sc.descs = sc.descs[:0]
	sc.local = sc.local[:0]
	sc.global = sc.global[:0]
	sc.refund = sc.refund[:0]
	sc.quotas = 0
	sc.postpaids = 0
}

// outcome is the decision of both layers for a request.
type outcome struct {
	allowed     bool
	layer       Layer // the refusing layer when !allowed
	globalLayer Layer // the layer that answered for global hits: global or fallback
	localDone   bool  // local states are valid
	globalDone  bool  // global states are valid
	gray        bool
	quota       bool // refused because every quota descriptor refused
	cfg         *descriptors.Config
	domain      string
}

// decide runs the two layers for a checked request and builds the response.
func (s *Server) decide(ctx context.Context, req *rlsv3.RateLimitRequest, note *traceNote) (*rlsv3.RateLimitResponse, error) {
	cfg := s.opts.Rules.Rules()
	s.opts.Metrics.useRules(cfg)
	dom := cfg.Domain(req.GetDomain())
	if dom == nil {
		s.opts.Metrics.unknownDomain()
		return s.allOK(req), nil
	}
	sc := s.scratch.Get().(*scratch)
	defer s.scratch.Put(sc)
	sc.reset()
	sc.overrides = s.overrides(cfg)
	out := outcome{allowed: true, gray: s.isGray(req), cfg: cfg, domain: dom.Name}
	s.match(sc, dom, req)
	if secret, ok := s.emergencySecret(req); ok && s.emergencyAllows(dom.Name, secret) {
		return s.emergencyOK(req, sc, dom.Name, note), nil
	}
	s.buildHits(sc, req, out.gray)

	if len(sc.local) > 0 {
		sc.localStates = grow(sc.localStates, len(sc.local))
		d, err := s.opts.Local.Hit(ctx, sc.local, sc.localStates)
		switch {
		case err != nil:
			// The memory backend never fails; a limiter that does is skipped
			// rather than failing the request.
			s.log.Warn("local layer failed; not enforcing it", "err", err)
		case d.Answer == bucket.Bypassed:
			return s.bypass(req, dom.Name, note), nil
		case d.Answer != bucket.Skipped:
			out.localDone = true
			if !d.Allowed {
				out.allowed, out.layer = false, LayerLocal
			}
		}
	}
	if len(sc.global) > 0 && s.opts.Global != nil {
		if out.allowed {
			if s.decideGlobal(ctx, sc, &out) {
				return s.bypass(req, dom.Name, note), nil
			}
		} else {
			s.giveGlobal(ctx, sc)
		}
	}
	if out.allowed && !s.opts.Shadow &&
		(sc.postpaids > 0 && s.postpaidRefused(sc, &out) || sc.quotas > 0 && s.quotaRefused(sc, &out)) {
		s.giveBackTakes(ctx, sc, &out)
	}
	resp := s.respond(sc, req, &out)
	if note != nil {
		note.note(sc, &out)
	}
	s.opts.Metrics.request(dom.Name, resp.OverallCode == rlsv3.RateLimitResponse_OK)
	return resp, nil
}

// bypass answers OK to a request a layer said to let through whatever the
// others say (--redis-failure allow while Redis is failing).
func (s *Server) bypass(req *rlsv3.RateLimitRequest, domain string, note *traceNote) *rlsv3.RateLimitResponse {
	s.opts.Metrics.request(domain, true)
	if note != nil {
		note.layer = LayerFallback
	}
	return s.allOK(req)
}

// quotaRefused reports whether every quota descriptor of an allowed
// request was refused, which refuses the request (envoyproxy/ratelimit's
// quota mode), and marks out so. A quota descriptor without a decided
// bucket (no rule, or its layer skipped) is not refused, nor is one whose
// rule is in shadow mode: its status says OK.
func (s *Server) quotaRefused(sc *scratch, out *outcome) bool {
	layer := LayerNone
	for i := range sc.descs {
		ds := &sc.descs[i]
		if !ds.quota {
			continue
		}
		c, ok := pick(sc, ds, out)
		if !ok || c.state.Allowed || ds.shadow {
			return false
		}
		if layer == LayerNone {
			layer = c.layer
		}
	}
	out.allowed, out.quota, out.layer = false, true, layer
	return true
}

// postpaidRefused reports whether a postpaid descriptor that is not a
// quota was refused, which refuses the request as any other rule's refusal
// does (its hit is independent, so the layers did not), and marks out so.
// One in shadow mode is not refused: its status says OK.
func (s *Server) postpaidRefused(sc *scratch, out *outcome) bool {
	for i := range sc.descs {
		ds := &sc.descs[i]
		if !ds.postpaid || ds.quota || ds.shadow {
			continue
		}
		if c, ok := pick(sc, ds, out); ok && !c.state.Allowed {
			out.allowed, out.layer = false, c.layer
			return true
		}
	}
	return false
}

// giveBackTakes returns the tokens an allowed call of each layer took for
// a request refused afterwards (by its quotas or a postpaid rule): a refused request takes
// nothing, as when a layer refuses it. Quota, postpaid and shadow hits are
// independent and keep their effect, as they do in a refused call.
func (s *Server) giveBackTakes(ctx context.Context, sc *scratch, out *outcome) {
	if out.localDone {
		s.refundLocal(ctx, sc)
	}
	if out.globalDone {
		sc.refund = appendTakesAsGives(sc.refund[:0], sc.global)
		if len(sc.refund) > 0 {
			sc.globalStates = grow(sc.globalStates, len(sc.global)+len(sc.refund))
			if _, err := s.opts.Global.Hit(ctx, sc.refund, sc.globalStates[len(sc.global):]); err != nil && ctx.Err() == nil {
				s.log.Warn("global layer failed to take back tokens", "err", err)
			}
		}
	}
	sc.refund = sc.refund[:0]
}

// appendTakesAsGives appends to dst a give for every take of hits.
func appendTakesAsGives(dst, hits []bucket.Hit) []bucket.Hit {
	for _, h := range hits {
		if h.Cost > 0 && !h.Give && !h.Independent {
			h.Give = true
			dst = append(dst, h)
		}
	}
	return dst
}

// decideGlobal asks the global layer for every global hit at once and gives
// the local tokens back when it refuses. It reports whether the global
// layer said to let the whole request through (bucket.Bypassed).
func (s *Server) decideGlobal(ctx context.Context, sc *scratch, out *outcome) (bypass bool) {
	sc.globalStates = grow(sc.globalStates, len(sc.global))
	d, err := s.opts.Global.Hit(ctx, sc.global, sc.globalStates)
	if err != nil {
		// Failing open: without a global answer the local layer decides.
		// (The fail-open switch answers instead of failing; this path is
		// for a caller that gave up, or a global limiter without one.)
		if ctx.Err() == nil { // a caller that gave up is no failure of the layer
			s.opts.Metrics.globalError()
			s.log.Warn("global layer failed; answering from the local layer", "err", err)
		}
		return false
	}
	switch d.Answer {
	case bucket.Bypassed:
		return true
	case bucket.Skipped:
		return false // --redis-failure local: the local layer alone decides
	case bucket.Fallback:
		out.globalLayer = LayerFallback
	default:
		out.globalLayer = LayerGlobal
	}
	out.globalDone = true
	if d.Allowed {
		return false
	}
	out.allowed, out.layer = false, out.globalLayer
	s.refundLocal(ctx, sc)
	return false
}

// refundLocal gives back what the local layer took for this request. Its
// gives (is_negative_hits) stay applied: a give is never refused
// (bucket.Hit).
func (s *Server) refundLocal(ctx context.Context, sc *scratch) {
	sc.refund = appendTakesAsGives(sc.refund[:0], sc.local)
	if len(sc.refund) > 0 {
		sc.localStates = grow(sc.localStates, len(sc.local)+len(sc.refund))
		// The refund's states are not reported; they land after the real ones.
		_, _ = s.opts.Local.Hit(ctx, sc.refund, sc.localStates[len(sc.local):])
	}
	sc.refund = sc.refund[:0]
}

// giveGlobal applies the request's global gives and postpaid charges
// after the local layer refused it: a give is never refused, and usage
// that happened is charged, whichever layer refuses the rest (bucket.Hit).
// A request without either costs nothing here.
func (s *Server) giveGlobal(ctx context.Context, sc *scratch) {
	for _, h := range sc.global {
		if (h.Give || h.Overdraw) && h.Cost > 0 {
			sc.refund = append(sc.refund, h)
		}
	}
	if len(sc.refund) == 0 {
		return
	}
	sc.globalStates = grow(sc.globalStates, len(sc.refund))
	// Their states are not reported: the refused request reports the local
	// layer's.
	if _, err := s.opts.Global.Hit(ctx, sc.refund, sc.globalStates); err != nil && ctx.Err() == nil {
		s.log.Warn("global layer failed to take back tokens", "err", err)
	}
	sc.refund = sc.refund[:0]
}

// isGray reports whether any descriptor carries the gray marker.
func (s *Server) isGray(req *rlsv3.RateLimitRequest) bool {
	if s.opts.GrayKey == "" {
		return false
	}
	for _, d := range req.GetDescriptors() {
		for _, e := range d.GetEntries() {
			if e.GetKey() == s.opts.GrayKey && e.GetValue() == "true" {
				return true
			}
		}
	}
	return false
}

// match copies every descriptor's entries, without gray and emergency
// entries (marker), into the
// scratch buffer and finds its rule. Rules replaced by another matched rule
// (rate_limit.replaces) are dropped afterwards.
func (s *Server) match(sc *scratch, dom *descriptors.Domain, req *rlsv3.RateLimitRequest) {
	replacing := false
	for _, d := range req.GetDescriptors() {
		ds := descState{start: len(sc.entries), local: none, global: none}
		for _, e := range d.GetEntries() {
			if !s.marker(e.GetKey()) {
				sc.entries = append(sc.entries, descriptors.Entry{Key: e.GetKey(), Value: e.GetValue()})
			}
		}
		ds.end = len(sc.entries)
		if ds.end > ds.start {
			ds.rule = dom.Match(sc.entries[ds.start:ds.end])
			s.digestLong(sc.entries[ds.start:ds.end])
		}
		if ds.rule != nil && len(ds.rule.Replaces) > 0 {
			replacing = true
		}
		sc.descs = append(sc.descs, ds)
	}
	if replacing {
		dropReplaced(sc.descs)
	}
}

// digestLong replaces every key or value longer than MaxValueBytes, once
// matched, by a digest of it: the descriptor is still limited, in a bucket
// of its own per value, while bucket keys, logs and metric labels stay
// bounded. Refusing such a request instead would let Envoy pass it
// unlimited, by every one of its descriptors.
func (s *Server) digestLong(entries []descriptors.Entry) {
	for i := range entries {
		e := &entries[i]
		if len(e.Key) > s.opts.MaxValueBytes {
			e.Key = digest(e.Key)
			s.opts.Metrics.malformed(malformedLongValue)
		}
		if len(e.Value) > s.opts.MaxValueBytes {
			e.Value = digest(e.Value)
			s.opts.Metrics.malformed(malformedLongValue)
		}
	}
}

// digest names a long key or value: "sha256:" and 64 hex digits.
func digest(v string) string {
	sum := sha256.Sum256([]byte(v))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// dropReplaced forgets the rules whose name another matched rule replaces.
func dropReplaced(descs []descState) {
	for i := range descs {
		r := descs[i].rule
		if r == nil || r.Name == "" {
			continue
		}
		for j := range descs {
			if o := descs[j].rule; o != nil && j != i && replaces(o, r.Name) {
				descs[i].rule = nil
				break
			}
		}
	}
}

func replaces(r *descriptors.Rule, name string) bool {
	for _, n := range r.Replaces {
		if n == name {
			return true
		}
	}
	return false
}

// buildHits turns each matched descriptor into its local and global hits.
func (s *Server) buildHits(sc *scratch, req *rlsv3.RateLimitRequest, gray bool) {
	domain := req.GetDomain()
	for i, d := range req.GetDescriptors() {
		ds := &sc.descs[i]
		if ds.end == ds.start {
			if s.opts.QuotaMode { // a quota without a rule, never refused
				ds.quota = true
				sc.quotas++
			}
			continue
		}
		entries := sc.entries[ds.start:ds.end]
		rule := ds.rule
		override, hasOverride, err := overrideLimit(d.GetLimit())
		if err != nil {
			// Refusing the request would make Envoy let all of it through:
			// the rule decides as if Envoy had sent no override.
			s.opts.Metrics.malformed(malformedOverride)
			s.log.Debug("ignoring the limit override of a descriptor", "domain", domain, "err", err)
		}
		eff := sc.overrides.Lookup(domain, rule, entries) // nil without overrides
		if eff != nil && eff.Block {
			s.blockHit(sc, ds, domain, rule, entries, eff, cost(req, d))
			continue
		}
		if eff != nil && hasOverride {
			eff = nil // Envoy's limit override is enforced as it names (a block aside)
		}
		if eff != nil && eff.Allow {
			ds.unlimited = true // bypassed: answered as an unlimited rule
			continue
		}
		if rule != nil && rule.Unlimited && !hasOverride {
			ds.unlimited = true
			continue
		}
		// Envoy's limit override is enforced as the limit it names, as
		// envoyproxy/ratelimit does: the rule's shadow_mode and quota_mode
		// do not carry over to it.
		ds.override = hasOverride
		ds.shadow = rule != nil && (rule.ShadowMode || eff != nil && eff.Shadow) && !hasOverride
		if s.opts.QuotaMode || (rule != nil && rule.QuotaMode && !hasOverride) {
			ds.quota = true
			sc.quotas++
		}
		// A quota is postpaid (envoyproxy/ratelimit charges every hit), as
		// is a postpaid rule unless Envoy's override names the limit.
		ds.postpaid = ds.quota || (rule != nil && rule.Postpaid && !hasOverride)
		if ds.postpaid && !ds.quota {
			sc.postpaids++
		}
		if rule == nil && !hasOverride {
			continue
		}
		hit := bucket.Hit{Cost: cost(req, d), Give: d.GetIsNegativeHits(), Overdraw: ds.postpaid}
		hit.Independent = s.opts.Shadow || ds.shadow || ds.postpaid
		if rule != nil {
			ds.name = rule.Name
		}
		localLim, globalLim := ruleLimits(rule, eff)
		if localLim != nil {
			hit.Limit = *localLim
			kind := descriptors.LocalBucket
			if gray {
				hit.Limit.Requests *= 2
				hit.Limit.Burst *= 2
				kind = descriptors.GrayLocalBucket
			}
			sc.keyBuf = descriptors.AppendKeyMaterial(sc.keyBuf[:0], domain, rule, kind, entries, nil)
			hit.Key = s.nodeKeys.Sum(sc.keyBuf)
			ds.local = len(sc.local)
			sc.local = append(sc.local, hit)
		}
		var keyed *bucket.Limit // an override's numbers are part of its key
		switch {
		case hasOverride:
			hit.Limit = override
			keyed = &override
		case globalLim != nil:
			hit.Limit = *globalLim
		default:
			continue
		}
		if rule != nil { // never a nil *Rule: a layer would take it for a rule
			hit.Rule = rule // for the global layers that read its settings
		}
		sc.keyBuf = descriptors.AppendKeyMaterial(sc.keyBuf[:0], domain, rule, descriptors.GlobalBucket, entries, keyed)
		if s.sharedKeys {
			hit.Key = bucket.SumKey(sc.keyBuf)
		} else {
			hit.Key = s.nodeKeys.Sum(sc.keyBuf)
		}
		ds.global = len(sc.global)
		sc.global = append(sc.global, hit)
	}
}

// cost is a descriptor's token cost: its own hits_addend when set (0 checks
// only), else the request's, where 0 means 1.
func cost(req *rlsv3.RateLimitRequest, d *commonv3.RateLimitDescriptor) uint64 {
	if h := d.GetHitsAddend(); h != nil {
		return h.GetValue()
	}
	if n := req.GetHitsAddend(); n > 0 {
		return uint64(n)
	}
	return 1
}

// overrideLimit converts Envoy's per-descriptor limit override. An override
// sluice cannot honour (an unknown unit, a period or refill time beyond the
// bounds of rule files) is an error; the caller ignores it.
func overrideLimit(o *commonv3.RateLimitDescriptor_RateLimitOverride) (bucket.Limit, bool, error) {
	if o == nil {
		return bucket.Limit{}, false, nil
	}
	u, ok := unitOf(o.GetUnit())
	if !ok {
		return bucket.Limit{}, false, fmt.Errorf("limit override has unknown unit %v", o.GetUnit())
	}
	l, err := descriptors.NewLimit(u, o.GetRequestsPerUnit(), o.GetUnitMultiplier().GetValue())
	if err != nil {
		return bucket.Limit{}, false, fmt.Errorf("limit override: %w", err)
	}
	return l, true, nil
}

// grow returns s with length n, keeping its contents and reusing its
// array when large enough (slices.Grow, resliced).
func grow[T any](s []T, n int) []T { return slices.Grow(s, max(0, n-len(s)))[:n] }
