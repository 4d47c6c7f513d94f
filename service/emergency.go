package service

import (
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// EmergencySecrets tells whether a value is an accepted secret of the
// emergency channel (Options.EmergencyKey). Package emergency's File is
// the implementation rls serve wires. Match must not reveal through its
// timing which secret matched or how much of one.
type EmergencySecrets interface {
	Match(secret string) bool
}

// marker reports whether a descriptor entry's key is one the service strips
// before matching: the gray key or the emergency key. Keys are never empty
// (checkRequest), so an empty option matches none.
func (s *Server) marker(key string) bool {
	return key == s.opts.GrayKey || key == s.opts.EmergencyKey
}

// emergencySecret returns the value of the request's first entry with the
// emergency key, if the channel is on and the request has one.
func (s *Server) emergencySecret(req *rlsv3.RateLimitRequest) (string, bool) {
	if s.opts.EmergencyKey == "" {
		return "", false
	}
	for _, d := range req.GetDescriptors() {
		for _, e := range d.GetEntries() {
			if e.GetKey() == s.opts.EmergencyKey {
				return e.GetValue(), true
			}
		}
	}
	return "", false
}

// emergencyAllows checks a request's emergency secret and counts the
// attempt. A wrong secret is only counted: the request is then decided as
// any other, its emergency entries stripped.
func (s *Server) emergencyAllows(domain, secret string) bool {
	ok := s.opts.Emergency != nil && s.opts.Emergency.Match(secret)
	s.opts.Metrics.emergency(domain, ok)
	if !ok {
		s.log.Debug("emergency entry with a wrong secret: deciding the request as any other", "domain", domain)
	}
	return ok
}

// emergencyOK answers OK to a request carrying an accepted emergency
// secret, after sc holds its matched descriptors, and logs it with the
// rules it bypassed. No bucket is consulted and no token taken: the
// request is let through whatever the buckets hold, so asking them would
// only add a Redis round trip (or a stalled Redis' timeout) in an
// emergency, and taking tokens would refuse the ordinary clients the
// operator is trying to help. Neither the secret nor its digest is logged.
func (s *Server) emergencyOK(req *rlsv3.RateLimitRequest, sc *scratch, domain string, note *traceNote) *rlsv3.RateLimitResponse {
	rules := make([]string, 0, len(sc.descs))
	for i, d := range req.GetDescriptors() {
		switch r := sc.descs[i].rule; {
		case r != nil && !r.Unlimited:
			rules = append(rules, r.Path)
		case r == nil && d.GetLimit() != nil && sc.descs[i].end > sc.descs[i].start:
			rules = append(rules, overrideRule)
		}
	}
	s.log.Warn("emergency secret: request allowed whatever the limits", "domain", domain, "bypassed_rules", rules)
	s.opts.Metrics.request(domain, true)
	if note != nil {
		note.rules = len(rules)
	}
	return s.allOK(req)
}

func (m *Metrics) emergency(domain string, allowed bool) {
	if m == nil {
		return
	}
	m.emergencyReqs.inc(domain, allowed)
}
