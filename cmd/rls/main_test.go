package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when goroutines outlive its tests: serve's
// tests run the whole server in-process and stop it by cancelling its
// context, which must leave nothing running.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func noEnv(string) string { return "" }

func TestServeJSONLogsAndStopsOnCancel(t *testing.T) {
	s := serveInProcess(t, noEnv, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--log-format", "json")
	start := s.Serving()
	for _, k := range []string{"grpc_addr", "http_addr", "admin_addr", "backend", "rules", "rule_count"} {
		if _, ok := start[k]; !ok {
			t.Errorf("start line lacks %s: %v", k, start)
		}
	}
	s.StopCleanly()
}

func TestRunErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no command", nil, "usage"},
		{"unknown command", []string{"fly"}, "unknown command"},
		{"bad flag", []string{"serve", "--no-such-flag"}, "no-such-flag"},
		{"bad failure mode", []string{"serve", "--redis-failure", "maybe"}, `-redis-failure: unknown failure mode "maybe"`},
		{"validate without paths", []string{"validate"}, "usage: rls validate"},
		{"check without descriptors", []string{"check"}, "usage: rls check"},
		{"check bad descriptor", []string{"check", "novalue"}, "want KEY=VALUE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := run(context.Background(), tt.args, &out, &errOut, noEnv)
			if err == nil {
				t.Fatalf("run(%q) succeeded", tt.args)
			}
			if got := errOut.String() + err.Error(); !strings.Contains(got, tt.want) {
				t.Errorf("run(%q): %v, stderr %q; want %q", tt.args, err, errOut.String(), tt.want)
			}
			if errors.Is(err, errUsage) && exitCode(err) != 2 {
				t.Errorf("usage error exits %d, want 2", exitCode(err))
			}
		})
	}
}
