package config_test

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rls/sluice/config"
	"github.com/sluice-rls/sluice/descriptors"
)

func TestParseServe(t *testing.T) {
	env := map[string]string{
		"RLS_REDIS_TIMEOUT": "25ms",
		"RLS_SHADOW":        "true",
		"RLS_GRPC_ADDR":     ":9000",
	}
	getenv := func(k string) string { return env[k] }
	st, err := config.ParseServe([]string{"--grpc-addr", ":9100", "--max-entries", "8"}, getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if st.RedisTimeout != 25*time.Millisecond || !st.Shadow {
		t.Errorf("env not applied: timeout %v shadow %v", st.RedisTimeout, st.Shadow)
	}
	if st.GRPCAddr != ":9100" {
		t.Errorf("grpc addr %q: the flag must win over RLS_GRPC_ADDR", st.GRPCAddr)
	}
	if st.MaxRuleBytes != config.DefaultMaxRuleBytes || config.DefaultMaxRuleBytes != 16<<20 {
		t.Errorf("--max-rule-bytes defaults to %d, want 16 MiB", st.MaxRuleBytes)
	}
	if st.MaxEntries != 8 || st.MaxDescriptors != 256 || st.HTTPAddr != ":8080" || st.RedisFailure != "share" {
		t.Errorf("defaults or flags wrong: %+v", st)
	}
	// What spends tokens listens on loopback unless told otherwise.
	if st.AdminAddr != "127.0.0.1:8082" || st.JSONNegativeHits {
		t.Errorf("admin defaults: --admin-addr %q --json-negative-hits %v, want 127.0.0.1:8082 and false", st.AdminAddr, st.JSONNegativeHits)
	}
	// Connection limits are on by default.
	if st.HTTPReadTimeout != 5*time.Second || st.HTTPWriteTimeout != 10*time.Second || st.HTTPIdleTimeout != 30*time.Second ||
		st.HTTPMaxConns != 128 || st.GRPCHandshakeTimeout != 5*time.Second || st.GRPCMaxConnIdle != 2*time.Minute ||
		st.GRPCKeepaliveMinTime != 10*time.Second {
		t.Errorf("connection limit defaults: %+v", st)
	}
}

func TestParseServeErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"bad failure mode", []string{"--redis-failure", "maybe"}, nil, "--redis-failure"},
		{"bad env duration", nil, map[string]string{"RLS_REDIS_TIMEOUT": "soon"}, "RLS_REDIS_TIMEOUT"},
		{"cert without key", []string{"--tls-cert", "c.pem"}, nil, "--tls-key"},
		{"zero rule bytes", []string{"--max-rule-bytes", "0"}, nil, "--max-*"},
		{"stray argument", []string{"extra"}, nil, "no arguments"},
		{"negative timeout", []string{"--http-idle-timeout", "-1s"}, nil, "--http-"},
		{"negative conn cap", []string{"--http-max-conns", "-1"}, nil, "--http-max-conns"},
		{"no handshake timeout", []string{"--grpc-handshake-timeout", "0"}, nil, "--grpc-handshake-timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.ParseServe(tt.args, func(k string) string { return tt.env[k] }, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want one mentioning %q", err, tt.want)
			}
		})
	}
}

func TestEnvName(t *testing.T) {
	if got := config.EnvName("redis-timeout"); got != "RLS_REDIS_TIMEOUT" {
		t.Errorf("EnvName = %q", got)
	}
}

func TestLoadEmbeddedDefault(t *testing.T) {
	cfg, err := config.Load("", descriptors.Options{})
	if err != nil {
		t.Fatalf("embedded rules: %v", err)
	}
	if cfg.Domain("edge") == nil || cfg.Len() < 5 {
		t.Errorf("embedded rules: domain edge with %d rules", cfg.Len())
	}
}
