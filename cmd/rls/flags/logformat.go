package flags

import (
	"fmt"
	"strings"
)

// LogFormat is --log-format: how log lines are written.
type LogFormat int

const (
	LogText LogFormat = iota // slog's text handler: key=value
	LogJSON                  // slog's JSON handler, one object a line
)

// logFormats lists every LogFormat, in help order.
var logFormats = []LogFormat{LogText, LogJSON}

// String returns the --log-format spelling of f.
func (f LogFormat) String() string {
	if f == LogJSON {
		return "json"
	}
	return "text"
}

// MarshalText implements encoding.TextMarshaler, for flag.TextVar.
func (f LogFormat) MarshalText() ([]byte, error) { return []byte(f.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler: it parses a
// --log-format value, in any case.
func (f *LogFormat) UnmarshalText(b []byte) error {
	for _, c := range logFormats {
		if strings.EqualFold(c.String(), string(b)) {
			*f = c
			return nil
		}
	}
	return fmt.Errorf("unknown log format %q (want %s)", b, strings.Join(formatNames(), " or "))
}

func formatNames() []string {
	names := make([]string, len(logFormats))
	for i, f := range logFormats {
		names[i] = f.String()
	}
	return names
}

// formatList is the --log-format values for the help text.
func formatList() string { return strings.Join(formatNames(), " | ") }
