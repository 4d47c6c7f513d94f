package descriptors

import (
	"testing"
	"time"
)

func TestUnits(t *testing.T) {
	t.Parallel()
	const day = 24 * time.Hour
	tests := []struct {
		in   string
		want Unit
		name string
		dur  time.Duration
	}{
		{"second", Second, "second", time.Second},
		{"MINUTE", Minute, "minute", time.Minute},
		{"Hour", Hour, "hour", time.Hour},
		{"day", Day, "day", day},
		{"week", Week, "week", 7 * day},
		{"month", Month, "month", 30 * day},
		{"year", Year, "year", 365 * day},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			u, ok := ParseUnit(tt.in)
			if !ok || u != tt.want {
				t.Fatalf("ParseUnit(%q) = %v, %v, want %v, true", tt.in, u, ok, tt.want)
			}
			if got := u.String(); got != tt.name {
				t.Errorf("%v.String() = %q, want %q", tt.want, got, tt.name)
			}
			if got := u.Duration(); got != tt.dur {
				t.Errorf("%v.Duration() = %v, want %v", tt.want, got, tt.dur)
			}
		})
	}
	for _, bad := range []string{"", "seconds", "fortnight", " second"} {
		if u, ok := ParseUnit(bad); ok {
			t.Errorf("ParseUnit(%q) = %v, true, want false", bad, u)
		}
	}
	if got := Unit(0).String(); got != "unknown" {
		t.Errorf("Unit(0).String() = %q, want unknown", got)
	}
	if got := Unit(0).Duration(); got != 0 {
		t.Errorf("Unit(0).Duration() = %v, want 0", got)
	}
}

// TestUnitMatchesEnvoy pins the numbers to Envoy's RateLimitResponse.RateLimit.Unit.
func TestUnitMatchesEnvoy(t *testing.T) {
	t.Parallel()
	want := map[Unit]int{Second: 1, Minute: 2, Hour: 3, Day: 4, Month: 5, Year: 6, Week: 7}
	for u, n := range want {
		if int(u) != n {
			t.Errorf("%v = %d, want Envoy's %d", u, int(u), n)
		}
	}
}
