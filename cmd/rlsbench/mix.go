package main

import (
	"fmt"
	"math/rand/v2"
	"net/netip"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// The request mixes (-mix).
const (
	mixSpread = "spread" // one descriptor, remote_address from a large key space
	mixHot    = "hot"    // one descriptor, one key
	mixEnvoy  = "envoy"  // remote_address, user_id, route+user_id
)

// Key spaces of the envoy mix: an edge proxy's view of a busy service.
const (
	envoyAddresses = 10000
	envoyUsers     = 1000
	envoyPool      = 1 << 15 // requests pre-built for the envoy mix
)

// envoyRoutes are the route values of the envoy mix.
var envoyRoutes = [...]string{
	"/api/orders", "/api/users", "/api/cart", "/api/search", "/api/items",
	"/api/payments", "/api/login", "/api/reviews", "/api/stock", "/api/ship",
}

// poolOptions chooses the requests of a run.
type poolOptions struct {
	Mix      string
	Domain   string
	Keys     int    // distinct addresses of the spread mix
	HotValue string // remote_address of the hot mix
	Seed     uint64
}

// buildPool pre-builds the requests of a mix, so that the timed loop only
// indexes a slice: no key formatting, no allocation per call for the
// request. The requests are shared read-only by every caller (proto
// marshalling only reads a message).
func buildPool(o poolOptions) ([]*rlsv3.RateLimitRequest, error) {
	rng := rand.New(rand.NewPCG(o.Seed, 0x5eed))
	switch o.Mix {
	case mixSpread:
		if o.Keys < 1 {
			return nil, fmt.Errorf("-keys must be at least 1, not %d", o.Keys)
		}
		pool := make([]*rlsv3.RateLimitRequest, o.Keys)
		for i := range pool {
			pool[i] = request(o.Domain, entries("remote_address", randomAddr(rng)))
		}
		return pool, nil
	case mixHot:
		return []*rlsv3.RateLimitRequest{request(o.Domain, entries("remote_address", o.HotValue))}, nil
	case mixEnvoy:
		addrs := make([]string, envoyAddresses)
		for i := range addrs {
			addrs[i] = randomAddr(rng)
		}
		users := make([]string, envoyUsers)
		for i := range users {
			users[i] = fmt.Sprintf("user-%04d", i)
		}
		pool := make([]*rlsv3.RateLimitRequest, envoyPool)
		for i := range pool {
			user := users[rng.IntN(len(users))]
			pool[i] = request(o.Domain,
				entries("remote_address", addrs[rng.IntN(len(addrs))]),
				entries("user_id", user),
				entries("route", envoyRoutes[rng.IntN(len(envoyRoutes))], "user_id", user),
			)
		}
		return pool, nil
	}
	return nil, fmt.Errorf("-mix must be %s, %s or %s, not %q", mixSpread, mixHot, mixEnvoy, o.Mix)
}

// randomAddr is an IPv4 address drawn uniformly from the whole space.
func randomAddr(rng *rand.Rand) string {
	v := rng.Uint32()
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}).String()
}

func request(domain string, ds ...*commonv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
}

// entries builds a descriptor from key, value pairs.
func entries(kv ...string) *commonv3.RateLimitDescriptor {
	d := &commonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}
