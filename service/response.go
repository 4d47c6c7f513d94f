package service

import (
	"math"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluice-rls/sluice/bucket"
)

// statusParts are the messages of one descriptor status, allocated together.
type statusParts struct {
	status rlsv3.RateLimitResponse_DescriptorStatus
	limit  rlsv3.RateLimitResponse_RateLimit
	reset  durationpb.Duration
}

// The response blocks let a response of up to three descriptors (Envoy
// routes rarely send more) cost a single allocation sized to it: the
// response, its status pointers and every status' messages live in one
// object that the response keeps alive. One size would do, but a request of
// one descriptor would then allocate and clear three times what it uses.
type (
	responseBlock1 struct {
		resp  rlsv3.RateLimitResponse
		ptrs  [1]*rlsv3.RateLimitResponse_DescriptorStatus
		parts [1]statusParts
	}
	responseBlock2 struct {
		resp  rlsv3.RateLimitResponse
		ptrs  [2]*rlsv3.RateLimitResponse_DescriptorStatus
		parts [2]statusParts
	}
	responseBlock3 struct {
		resp  rlsv3.RateLimitResponse
		ptrs  [3]*rlsv3.RateLimitResponse_DescriptorStatus
		parts [3]statusParts
	}
)

// newResponse returns a response with n statuses, each with code OK.
func newResponse(n int) (*rlsv3.RateLimitResponse, []statusParts) {
	var (
		resp  *rlsv3.RateLimitResponse
		parts []statusParts
	)
	switch n {
	case 1:
		b := new(responseBlock1)
		resp, parts = &b.resp, b.parts[:]
		resp.Statuses = b.ptrs[:]
	case 2:
		b := new(responseBlock2)
		resp, parts = &b.resp, b.parts[:]
		resp.Statuses = b.ptrs[:]
	case 3:
		b := new(responseBlock3)
		resp, parts = &b.resp, b.parts[:]
		resp.Statuses = b.ptrs[:]
	default:
		resp, parts = new(rlsv3.RateLimitResponse), make([]statusParts, n)
		resp.Statuses = make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)
	}
	resp.OverallCode = rlsv3.RateLimitResponse_OK
	for i := range parts {
		parts[i].status.Code = rlsv3.RateLimitResponse_OK
		resp.Statuses[i] = &parts[i].status
	}
	return resp, parts
}

// allOK answers a request whose domain has no rules, or that a layer let
// through whatever the rules say.
func (s *Server) allOK(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	resp, _ := newResponse(len(req.GetDescriptors()))
	if s.opts.ResponseMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, nil, resp, s.opts.EmergencyKey)
	}
	return resp
}

// chosen is the layer a descriptor's status describes.
type chosen struct {
	state bucket.State
	hit   bucket.Hit
	layer Layer
}

// pick chooses the layer a status describes: the refusing one, else the one
// with the fewest whole tokens left.
func pick(sc *scratch, ds *descState, out *outcome) (chosen, bool) {
	hasLocal := ds.local != none && out.localDone
	hasGlobal := ds.global != none && out.globalDone
	var l, g chosen
	if hasLocal {
		l = chosen{sc.localStates[ds.local], sc.local[ds.local], LayerLocal}
	}
	if hasGlobal {
		g = chosen{sc.globalStates[ds.global], sc.global[ds.global], out.globalLayer}
	}
	switch {
	case hasLocal && hasGlobal:
		if !l.state.Allowed || (g.state.Allowed && l.state.Remaining <= g.state.Remaining) {
			return l, true
		}
		return g, true
	case hasLocal:
		return l, true
	case hasGlobal:
		return g, true
	}
	return chosen{}, false
}

// respond builds the response for a decided request.
func (s *Server) respond(sc *scratch, req *rlsv3.RateLimitRequest, out *outcome) *rlsv3.RateLimitResponse {
	resp, parts := newResponse(len(sc.descs))
	var (
		refused    chosen
		refusedIdx int
		retry      time.Duration
		tightest   chosen
		limited    bool
		// The quota refusal to report: the one whose wait is shortest,
		// since the request passes once any quota has tokens again.
		quota      chosen
		quotaIdx   = none
		quotaRetry time.Duration
	)
	for i := range sc.descs {
		ds := &sc.descs[i]
		p := &parts[i]
		if ds.unlimited {
			// As envoyproxy/ratelimit: OK with limit_remaining MaxUint32.
			p.status.LimitRemaining = math.MaxUint32
			continue
		}
		c, ok := pick(sc, ds, out)
		if !ok {
			continue
		}
		fillStatus(p, c, ds.name)
		result := resultOK
		switch {
		case !c.state.Allowed && ds.shadow:
			result = resultShadow
		case !c.state.Allowed && s.opts.Shadow:
			// As envoyproxy/ratelimit's SHADOW_MODE: the status tells the
			// truth, the overall code is OK.
			result = resultShadow
			p.status.Code = rlsv3.RateLimitResponse_OVER_LIMIT
		case !c.state.Allowed && ds.quota:
			result = resultOverLimit
			p.status.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			if wait := retryAfter(c); quotaIdx == none || wait < quotaRetry {
				quota, quotaIdx, quotaRetry = c, i, wait
			}
		case !c.state.Allowed:
			result = resultOverLimit
			p.status.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			if wait := retryAfter(c); wait >= retry {
				refused, refusedIdx, retry = c, i, wait
			}
		case c.state.Remaining*5 < c.hit.Limit.Burst:
			result = resultNearLimit
		}
		if !limited || c.state.Remaining < tightest.state.Remaining {
			tightest, limited = c, true
		}
		s.opts.Metrics.decision(out.cfg, out.domain, ds.rule, sc.entries[ds.start:ds.end], c.layer, result, out.gray)
		if ds.rule != nil && ds.rule.Utilisation {
			s.opts.Metrics.tenantTokens(ds.rule, sc.entries[ds.start:ds.end], c)
		}
	}
	if out.quota && quotaIdx != none && resp.OverallCode == rlsv3.RateLimitResponse_OK {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		refused, refusedIdx, retry = quota, quotaIdx, quotaRetry
	}
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		if !s.opts.NoRefusalDetails {
			s.addRefusal(resp, refused, retry, out.gray)
		}
		s.logRefusal(sc, refusedIdx, refused, out)
		s.noteRefusals(sc, out, resp)
	}
	if s.opts.RateLimitHeaders {
		if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
			// Refused: the headers name the limit that refused.
			s.addDraftHeaders(resp, refused, true)
		} else if limited {
			s.addDraftHeaders(resp, tightest, false)
		}
	}
	if s.opts.ResponseMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, sc, resp, s.opts.EmergencyKey)
	}
	return resp
}

// retryAfter is the wait until a refused descriptor's bucket has the
// tokens again; never when no wait can: a cost above the burst, or a limit
// of 0 (a block, or requests_per_unit: 0), which never refills.
func retryAfter(c chosen) time.Duration {
	if c.hit.Limit.Requests == 0 || c.hit.Cost > c.hit.Limit.Burst {
		return never
	}
	return c.state.RetryAfter
}

// fillStatus describes the chosen layer's bucket in a status.
func fillStatus(p *statusParts, c chosen, name string) {
	unit, mult := responseUnit(c.hit.Limit.Period)
	p.limit.Name = name
	p.limit.RequestsPerUnit = clamp32(c.hit.Limit.Requests)
	p.limit.Unit = unit
	if mult > 1 {
		p.limit.UnitMultiplier = wrapperspb.UInt32(mult)
	}
	p.status.CurrentLimit = &p.limit
	p.status.LimitRemaining = clamp32(c.state.Remaining)
	p.reset.Seconds = int64(c.state.ResetAfter / time.Second)
	p.reset.Nanos = int32(c.state.ResetAfter % time.Second)
	p.status.DurationUntilReset = &p.reset
}

// never is the retry time of a refusal no wait can cure: a cost above the
// bucket's burst.
const never = time.Duration(math.MaxInt64)

// addRefusal adds the retry headers and the JSON body of an OVER_LIMIT
// answer. A refusal that never passes has no retry header, no
// retry_after_ms and no reset: telling a client to retry would only bring
// it back.
func (s *Server) addRefusal(resp *rlsv3.RateLimitResponse, c chosen, retry time.Duration, gray bool) {
	ms := ceilDiv(retry, time.Millisecond)
	if retry != never {
		secs := max(ceilDiv(retry, time.Second), 1)
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
			header("retry-after", strconv.FormatInt(secs, 10)),
			header("x-ratelimit-retry-after-ms", strconv.FormatInt(ms, 10)),
		)
	}
	resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, header("x-ratelimit-layer", c.layer.String()))
	if gray {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, header("x-ratelimit-gray", "true"))
	}
	// The body has only numbers and fixed words, so appending beats
	// encoding/json's reflection on the path a flood of refusals takes.
	b := make([]byte, 0, 128)
	b = append(b, `{"code":429,"message":"Too Many Requests",`...)
	if retry != never {
		// reset: seconds until the bucket is full again, as the draft
		// RateLimit-Reset header, at least 1 (a refusal never says "now").
		b = append(b, `"retry_after_ms":`...)
		b = strconv.AppendInt(b, ms, 10)
		b = append(b, `,"reset":`...)
		b = strconv.AppendInt(b, max(ceilDiv(c.state.ResetAfter, time.Second), 1), 10)
		b = append(b, ',')
	}
	b = append(b, `"limit":`...)
	b = strconv.AppendUint(b, c.hit.Limit.Requests, 10)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendUint(b, uint64(clamp32(c.state.Remaining)), 10)
	b = append(b, `,"layer":"`...)
	b = append(b, c.layer.String()...)
	b = append(b, '"')
	if gray { // omitted when false: non-gray refusals keep their body
		b = append(b, `,"gray":true`...)
	}
	b = append(b, '}')
	resp.RawBody = b
}

// logRefusal logs one refused request in RefusalLogEvery, so operators can
// see who is being limited without a log line per refusal.
func (s *Server) logRefusal(sc *scratch, i int, c chosen, out *outcome) {
	every := s.opts.RefusalLogEvery
	if every <= 0 || s.refusals.Add(1)%uint64(every) != 0 {
		return
	}
	ds := &sc.descs[i]
	rule := overrideRule
	if ds.rule != nil {
		rule = ds.rule.Path
	}
	var values strings.Builder
	for j, e := range sc.entries[ds.start:ds.end] {
		if j > 0 {
			values.WriteByte(',')
		}
		values.WriteString(e.Key)
		values.WriteByte('=')
		values.WriteString(e.Value)
	}
	s.log.Info("request over limit", "sampled_1_in", every, "domain", out.domain, "rule", rule,
		"layer", c.layer.String(), "descriptor", values.String(), "gray", out.gray,
		"retry_after", c.state.RetryAfter)
}

// addDraftHeaders adds draft-03 RateLimit-* headers describing c, under the
// names Options give: the refused descriptor's bucket when the request is
// refused (its reset then at least 1 second: a refusal never says "now"),
// else the bucket closest to refusing.
func (s *Server) addDraftHeaders(resp *rlsv3.RateLimitResponse, c chosen, refused bool) {
	reset := ceilDiv(c.state.ResetAfter, time.Second)
	if refused {
		reset = max(reset, 1)
	}
	resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd,
		header(s.opts.HeaderLimit, strconv.FormatUint(c.hit.Limit.Requests, 10)),
		header(s.opts.HeaderRemaining, strconv.FormatUint(c.state.Remaining, 10)),
		header(s.opts.HeaderReset, strconv.FormatInt(reset, 10)),
	)
}

func header(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, Value: v} }

// ceilDiv divides d by unit, rounding up.
func ceilDiv(d, unit time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + unit - 1) / unit)
}

func clamp32(n uint64) uint32 {
	if n > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(n)
}
