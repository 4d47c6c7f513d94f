package service

import (
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/sluice-rls/sluice/descriptors"
)

// unitOf returns the rule-file unit of an Envoy limit-override unit.
func unitOf(u typev3.RateLimitUnit) (descriptors.Unit, bool) {
	switch u {
	case typev3.RateLimitUnit_SECOND:
		return descriptors.Second, true
	case typev3.RateLimitUnit_MINUTE:
		return descriptors.Minute, true
	case typev3.RateLimitUnit_HOUR:
		return descriptors.Hour, true
	case typev3.RateLimitUnit_DAY:
		return descriptors.Day, true
	case typev3.RateLimitUnit_MONTH:
		return descriptors.Month, true
	case typev3.RateLimitUnit_YEAR:
		return descriptors.Year, true
	}
	return 0, false
}

// responseUnits lists the units a status can name, largest first.
var responseUnits = [...]struct {
	unit descriptors.Unit
	enum rlsv3.RateLimitResponse_RateLimit_Unit
}{
	{descriptors.Year, rlsv3.RateLimitResponse_RateLimit_YEAR},
	{descriptors.Month, rlsv3.RateLimitResponse_RateLimit_MONTH},
	{descriptors.Week, rlsv3.RateLimitResponse_RateLimit_WEEK},
	{descriptors.Day, rlsv3.RateLimitResponse_RateLimit_DAY},
	{descriptors.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
	{descriptors.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
	{descriptors.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
}

// responseUnit expresses a bucket period as the largest unit that divides it
// and a multiplier (1 for a plain unit).
func responseUnit(p time.Duration) (rlsv3.RateLimitResponse_RateLimit_Unit, uint32) {
	for _, u := range responseUnits {
		d := u.unit.Duration()
		if p >= d && p%d == 0 {
			return u.enum, uint32(min(p/d, 1<<32-1))
		}
	}
	return rlsv3.RateLimitResponse_RateLimit_UNKNOWN, 0
}
