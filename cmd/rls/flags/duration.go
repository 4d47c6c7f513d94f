package flags

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ParseDuration is time.ParseDuration with days: a leading whole number
// of days, "1d" or "2d12h" (a day is 24 hours; the flag package and the
// time package have no unit above the hour, and operators think in days).
func ParseDuration(s string) (time.Duration, error) {
	days, rest, ok := strings.Cut(s, "d")
	if !ok {
		return time.ParseDuration(s)
	}
	n, err := strconv.ParseUint(days, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("invalid duration %q: want a whole number of days before d, as 1d or 2d12h", s)
	}
	d := time.Duration(n) * 24 * time.Hour
	if rest == "" {
		return d, nil
	}
	more, err := time.ParseDuration(rest)
	if err != nil || more < 0 {
		return 0, fmt.Errorf("invalid duration %q: after the days, a duration such as 12h", s)
	}
	return d + more, nil
}

// FormatDuration prints d for people: rounded to the millisecond (to the
// second from a minute on), with days when it is a day or more: 962ms,
// 1m5s, 1d2h.
func FormatDuration(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + FormatDuration(-d)
	case d < time.Minute:
		return d.Round(time.Millisecond).String()
	case d < 24*time.Hour:
		return d.Round(time.Second).String()
	}
	d = d.Round(time.Second)
	days := d / (24 * time.Hour)
	s := strconv.FormatInt(int64(days), 10) + "d"
	if rest := d - days*24*time.Hour; rest > 0 {
		s += rest.String()
	}
	return s
}

// duration is a flag.Value of ParseDuration.
type duration struct{ d *time.Duration }

func (v duration) String() string {
	if v.d == nil {
		return "0s"
	}
	return FormatDuration(*v.d)
}

func (v duration) Set(s string) error {
	d, err := ParseDuration(s)
	if err != nil {
		return err
	}
	*v.d = d
	return nil
}

// DurationVar defines a duration flag as fs.DurationVar does, taking days
// too (ParseDuration). Name the value's type in usage, in back quotes
// (`duration`), for the help text.
func DurationVar(fs *flag.FlagSet, p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	fs.Var(duration{p}, name, usage)
}
