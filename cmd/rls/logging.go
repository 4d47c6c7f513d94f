package main

import (
	"io"
	"log/slog"

	"github.com/sluice-rls/sluice/cmd/rls/flags"
)

// durationsAsText makes slog's JSON handler write time.Duration values as
// text ("10ms", as the text handler does) instead of integer nanoseconds,
// which a reader (or a log query) cannot tell from any other number.
func durationsAsText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}

// newLogger writes log lines at level and above to w, in format.
func newLogger(level slog.Level, format flags.LogFormat, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == flags.LogJSON {
		opts.ReplaceAttr = durationsAsText
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
