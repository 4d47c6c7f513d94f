//go:build integration

package integration

import (
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestCheckCommandOverMutualTLS runs `rls check` against `rls serve` with
// client certificates required: its exit status tells OK (0) from
// OVER_LIMIT (1) from errors (2).
func TestCheckCommandOverMutualTLS(t *testing.T) {
	t.Parallel()
	m := newMTLS(t)
	p := startRLS(t, m.flags...)
	mtls := []string{"--addr", p.GRPCAddr, "--timeout", "10s", "--tls-ca", m.CA, "--tls-cert", m.ClientCert, "--tls-key", m.ClientKey, "--domain", "edge"}
	tests := []struct {
		name  string
		args  []string
		exit  int
		first string // the first line of stdout
	}{
		// Rules of ruleset/default-rules.yaml: user_id alone has no limit,
		// remote_address=50.0.0.5 a limit of 0.
		{"OK", append(slices.Clone(mtls), "user_id=alice"), 0, "OK"},
		{"OVER_LIMIT", append(slices.Clone(mtls), "remote_address=50.0.0.5"), 1, "OVER_LIMIT"},
		{"server name verified", append(slices.Clone(mtls), "--tls-server-name", "sluice", "user_id=alice"), 0, "OK"},
		{"wrong server name", append(slices.Clone(mtls), "--tls-server-name", "elsewhere", "user_id=alice"), 2, ""},
		{"no client certificate", []string{"--addr", p.GRPCAddr, "--timeout", "10s", "--tls-ca", m.CA, "user_id=alice"}, 2, ""},
		{"plaintext", []string{"--addr", p.GRPCAddr, "--timeout", "10s", "user_id=alice"}, 2, ""},
		{"usage", append(slices.Clone(mtls), "novalue"), 2, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command(rlsBinary, append([]string{"check"}, tt.args...)...)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			exit := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				exit = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if exit != tt.exit {
				t.Errorf("rls check %q exited %d, want %d\nstdout: %s\nstderr: %s", tt.args, exit, tt.exit, out, stderr.String())
			}
			if first, _, _ := strings.Cut(string(out), "\n"); first != tt.first {
				t.Errorf("rls check %q printed %q first, want %q", tt.args, first, tt.first)
			}
		})
	}
}
