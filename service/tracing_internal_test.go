package service

import "testing"

func TestUnsampled(t *testing.T) {
	const id = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-"
	for tp, want := range map[string]bool{
		id + "00": true,
		id + "02": true,
		id + "0a": true,
		id + "01": false,
		id + "03": false,
		id + "0f": false,
		id + "0g": false, // invalid: the propagator decides
		"":        false,
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00": false, // another version
		id + "00-extra": false,
	} {
		if got := unsampled(tp); got != want {
			t.Errorf("unsampled(%q) = %v, want %v", tp, got, want)
		}
	}
}
