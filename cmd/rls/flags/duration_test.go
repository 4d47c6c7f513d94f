package flags_test

import (
	"testing"
	"time"

	"github.com/sluice-rls/sluice/cmd/rls/flags"
)

func TestParseDuration(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want time.Duration
	}{
		{"1d", 24 * time.Hour},
		{"2d12h", 60 * time.Hour},
		{"90m", 90 * time.Minute},
		{"0", 0},
	} {
		if got, err := flags.ParseDuration(tt.in); err != nil || got != tt.want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	for _, in := range []string{"d", "1.5d", "-1d", "1d-2h", "1dx", "99999d", "1h2d"} {
		if got, err := flags.ParseDuration(in); err == nil {
			t.Errorf("ParseDuration(%q) = %v, want an error", in, got)
		}
	}
}

func TestFormatDuration(t *testing.T) {
	for _, tt := range []struct {
		in   time.Duration
		want string
	}{
		{962166254 * time.Nanosecond, "962ms"},
		{65*time.Second + 400*time.Millisecond, "1m5s"},
		{26*time.Hour + 30*time.Minute, "1d2h30m0s"},
		{48 * time.Hour, "2d"},
		{-1500 * time.Microsecond, "-2ms"},
		{0, "0s"},
	} {
		if got := flags.FormatDuration(tt.in); got != tt.want {
			t.Errorf("FormatDuration(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
