package descriptors

import (
	"strings"
	"time"
)

// Unit is the time unit of a rate limit, as in Envoy's RateLimitResponse.
// The zero value is an unknown unit.
type Unit uint8

// The units a rule file may name. Their numeric values are those of Envoy's
// RateLimitResponse.RateLimit.Unit enum (WEEK was added last, so it is 7),
// so the service converts with a plain type conversion.
const (
	Second Unit = 1
	Minute Unit = 2
	Hour   Unit = 3
	Day    Unit = 4
	Month  Unit = 5
	Year   Unit = 6
	Week   Unit = 7
)

// ParseUnit returns the unit named s ("second" … "year"), ignoring case.
// It reports false for any other string, the empty string included.
func ParseUnit(s string) (Unit, bool) {
	switch strings.ToLower(s) {
	case "second":
		return Second, true
	case "minute":
		return Minute, true
	case "hour":
		return Hour, true
	case "day":
		return Day, true
	case "week":
		return Week, true
	case "month":
		return Month, true
	case "year":
		return Year, true
	}
	return 0, false
}

// String returns the unit's lower-case name, or "unknown" for the zero value
// and any out-of-range value.
func (u Unit) String() string {
	switch u {
	case Second:
		return "second"
	case Minute:
		return "minute"
	case Hour:
		return "hour"
	case Day:
		return "day"
	case Week:
		return "week"
	case Month:
		return "month"
	case Year:
		return "year"
	}
	return "unknown"
}

// Duration returns the length of one unit. As in envoyproxy/ratelimit, a
// month is 30 days and a year 365 days; a week is 7 days. An unknown unit
// has duration 0.
func (u Unit) Duration() time.Duration {
	const day = 24 * time.Hour
	switch u {
	case Second:
		return time.Second
	case Minute:
		return time.Minute
	case Hour:
		return time.Hour
	case Day:
		return day
	case Week:
		return 7 * day
	case Month:
		return 30 * day
	case Year:
		return 365 * day
	}
	return 0
}

// MarshalYAML writes the unit as its name, so a File round-trips through
// yaml.Marshal.
func (u Unit) MarshalYAML() (any, error) {
	return u.String(), nil
}
