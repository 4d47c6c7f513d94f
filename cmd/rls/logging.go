package main

import "log/slog"

// durationsAsText makes slog's JSON handler write time.Duration values as
// text ("10ms", as the text handler does) instead of integer nanoseconds,
// which a reader (or a log query) cannot tell from any other number.
func durationsAsText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}
