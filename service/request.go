package service

import (
	"errors"
	"fmt"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// checkRequest rejects requests that are malformed or larger than the
// configured limits, naming the first offending part. Envoy builds every
// part it checks from its own configuration; what a client controls — the
// values — never makes a request invalid: long values are limited by their
// digest (digestLong) and bad limit overrides are ignored (overrideLimit),
// because Envoy lets an invalid request through unlimited.
func (s *Server) checkRequest(req *rlsv3.RateLimitRequest) error {
	if req == nil {
		return errors.New("empty request")
	}
	if req.GetDomain() == "" {
		return errors.New("rate limit domain must not be empty") // envoyproxy/ratelimit's message
	}
	if len(req.GetDomain()) > s.opts.MaxValueBytes {
		return fmt.Errorf("domain is %d bytes, more than the limit of %d", len(req.GetDomain()), s.opts.MaxValueBytes)
	}
	// As envoyproxy/ratelimit. A request without descriptors has nothing
	// to limit, so Envoy letting it through on this error loses nothing.
	if len(req.GetDescriptors()) == 0 {
		return errors.New("rate limit descriptor list must not be empty")
	}
	if n := len(req.GetDescriptors()); n > s.opts.MaxDescriptors {
		return fmt.Errorf("request has %d descriptors, more than the limit of %d", n, s.opts.MaxDescriptors)
	}
	for i, d := range req.GetDescriptors() {
		if d == nil {
			return fmt.Errorf("descriptor %d is null", i)
		}
		if n := len(d.GetEntries()); n > s.opts.MaxEntries {
			return fmt.Errorf("descriptor %d has %d entries, more than the limit of %d", i, n, s.opts.MaxEntries)
		}
		for j, e := range d.GetEntries() {
			if e == nil {
				return fmt.Errorf("descriptor %d entry %d is null", i, j)
			}
			if e.GetKey() == "" {
				return fmt.Errorf("descriptor %d entry %d has an empty key", i, j)
			}
		}
	}
	return nil
}
