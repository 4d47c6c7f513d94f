package flags_test

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rls/sluice/audit/redisaudit"
	"github.com/sluice-rls/sluice/backend/lease"
	"github.com/sluice-rls/sluice/backend/memory"
	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/cmd/rls/flags"
	"github.com/sluice-rls/sluice/fallback"
	"github.com/sluice-rls/sluice/ruleset"
	"github.com/sluice-rls/sluice/service"
	"github.com/sluice-rls/sluice/xds"
)

func noEnv(string) string { return "" }

func envOf(env map[string]string) func(string) string {
	return func(k string) string { return env[k] }
}

func TestParseServe(t *testing.T) {
	env := map[string]string{
		"RLS_REDIS_TIMEOUT": "25ms",
		"RLS_SHADOW":        "true",
		"RLS_GRPC_ADDR":     ":9000",
	}
	st, err := flags.ParseServe([]string{"--grpc-addr", ":9100", "--max-entries", "8"}, envOf(env), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if st.RedisTimeout != 25*time.Millisecond || !st.Shadow {
		t.Errorf("env not applied: timeout %v shadow %v", st.RedisTimeout, st.Shadow)
	}
	if st.GRPCAddr != ":9100" {
		t.Errorf("grpc addr %q: the flag must win over RLS_GRPC_ADDR", st.GRPCAddr)
	}
	if st.MaxEntries != 8 || st.HTTPAddr != ":8080" {
		t.Errorf("flags or defaults wrong: %+v", st)
	}
	// What spends tokens listens on loopback unless told otherwise.
	if st.AdminAddr != "127.0.0.1:8082" || st.JSONNegativeHits {
		t.Errorf("admin defaults: --admin-addr %q --json-negative-hits %v, want 127.0.0.1:8082 and false", st.AdminAddr, st.JSONNegativeHits)
	}
	// Connection limits are on by default.
	if st.HTTPReadTimeout != 5*time.Second || st.HTTPWriteTimeout != 10*time.Second || st.HTTPIdleTimeout != 30*time.Second ||
		st.HTTPMaxConns != 128 || st.GRPCHandshakeTimeout != 5*time.Second || st.GRPCMaxConnIdle != 2*time.Minute ||
		st.GRPCKeepaliveMinTime != 10*time.Second || st.GRPCMaxConns != 4096 || st.GRPCFirstCallTimeout != 5*time.Second {
		t.Errorf("connection limit defaults: %+v", st)
	}
}

// TestServeFlagsSetTheirOptions: each flag of the node's listeners, TLS,
// xDS, tracing, emergency channel and refusals, from the command line or its RLS_*
// variable, sets its own field of node.Options (the node's tests set the
// fields directly).
func TestServeFlagsSetTheirOptions(t *testing.T) {
	env := map[string]string{
		"RLS_EMERGENCY_SECRET_FILE": "digests",
		"RLS_TRACING_ENDPOINT":      "collector:4317",
		"RLS_TRACING_INSECURE":      "true",
	}
	st, err := flags.ParseServe([]string{
		"--grpc-addr", "unix:/run/grpc.sock", "--http-addr", "unix:///run/http.sock", "--admin-addr", "127.0.0.1:0",
		"--metrics-addr", ":19001", "--metrics-path", "/stats/prometheus",
		"--grpc-first-call-timeout", "2s", "--grpc-max-conns", "2",
		"--tls-cert", "server.pem", "--tls-key", "server.key", "--tls-client-ca", "envoy-ca.pem", "--tls-client-san", "envoy",
		"--admin-tls-client-ca", "ops-ca.pem", "--admin-tls-client-san", "alice",
		"--redis", "rediss://redis:6379", "--redis-ca", "redis-ca.pem", "--redis-tls-cert", "client.pem", "--redis-tls-key", "client.key",
		"--emergency-key", "emergency",
		"--max-rule-bytes", "2000", "--refusal-details=false", "--log-refusals", "7", "--max-tenants", "250",
		"--share", "0.25",
	}, envOf(env), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	xdsSt, err := flags.ParseServe([]string{
		"--xds-server", "cp:18000", "--xds-node-id", "envoy-ratelimit", "--xds-tls-ca", "xds-ca.pem",
		"--xds-tls-cert", "xds.pem", "--xds-tls-key", "xds.key", "--xds-tls-server-name", "cp.example",
		"--xds-backoff-min", "10ms", "--xds-backoff-max", "20ms", "--xds-max-depth", "2",
	}, envOf(map[string]string{"RLS_XDS_MAX_RESOURCES": "3"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		flag      string
		got, want any
	}{
		{"--grpc-addr", st.GRPCAddr, "unix:/run/grpc.sock"},
		{"--http-addr", st.HTTPAddr, "unix:///run/http.sock"},
		{"--admin-addr", st.AdminAddr, "127.0.0.1:0"},
		{"--share", st.Share, 0.25},
		{"--metrics-addr", st.MetricsAddr, ":19001"},
		{"--metrics-path", st.MetricsPath, "/stats/prometheus"},
		{"--grpc-first-call-timeout", st.GRPCFirstCallTimeout, 2 * time.Second},
		{"--grpc-max-conns", st.GRPCMaxConns, 2},
		{"--tls-cert", st.TLSCert, "server.pem"},
		{"--tls-key", st.TLSKey, "server.key"},
		{"--tls-client-ca", st.TLSClientCA, "envoy-ca.pem"},
		{"--tls-client-san", st.TLSClientSAN, "envoy"},
		{"--admin-tls-client-ca", st.AdminTLSClientCA, "ops-ca.pem"},
		{"--admin-tls-client-san", st.AdminTLSClientSAN, "alice"},
		{"--redis-ca", st.RedisCA, "redis-ca.pem"},
		{"--redis-tls-cert", st.RedisTLSCert, "client.pem"},
		{"--redis-tls-key", st.RedisTLSKey, "client.key"},
		{"--emergency-key", st.Emergency.Key, "emergency"},
		{"RLS_EMERGENCY_SECRET_FILE", st.Emergency.SecretFile, "digests"},
		{"RLS_TRACING_ENDPOINT", st.TracingEndpoint, "collector:4317"},
		{"RLS_TRACING_INSECURE", st.TracingInsecure, true},
		{"--max-rule-bytes", st.MaxRuleBytes, int64(2000)},
		{"--refusal-details=false", st.NoRefusalDetails, true},
		{"--log-refusals", st.RefusalLogEvery, 7},
		{"--max-tenants", st.MaxTenants, 250},
		{"--xds-server", xdsSt.XDS.Server, "cp:18000"},
		{"--xds-node-id", xdsSt.XDS.NodeID, "envoy-ratelimit"},
		{"--xds-tls-ca", xdsSt.XDS.TLSCA, "xds-ca.pem"},
		{"--xds-tls-cert", xdsSt.XDS.TLSCert, "xds.pem"},
		{"--xds-tls-key", xdsSt.XDS.TLSKey, "xds.key"},
		{"--xds-tls-server-name", xdsSt.XDS.TLSServerName, "cp.example"},
		{"--xds-backoff-min", xdsSt.XDS.BackoffMin, 10 * time.Millisecond},
		{"--xds-backoff-max", xdsSt.XDS.BackoffMax, 20 * time.Millisecond},
		{"--xds-max-depth", xdsSt.XDS.MaxDepth, 2},
		{"RLS_XDS_MAX_RESOURCES", xdsSt.XDS.MaxResources, 3},
	} {
		if f.got != f.want {
			t.Errorf("%s set %v, want %v", f.flag, f.got, f.want)
		}
	}
}

// TestServeDefaultsAreTheOwners: a flag whose default belongs to another
// package has that package's default, not a copy that may drift.
func TestServeDefaultsAreTheOwners(t *testing.T) {
	st, err := flags.ParseServe(nil, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []struct {
		flag      string
		got, want any
	}{
		{"--max-rule-bytes", st.MaxRuleBytes, int64(ruleset.DefaultMaxRuleBytes)},
		{"--redis-timeout", st.RedisTimeout, redisbackend.DefaultTimeout},
		{"--redis-failure", st.RedisFailure, fallback.Share},
		{"--consistency", st.Consistency, lease.DefaultConsistency},
		{"--lease-period", st.LeasePeriod, lease.DefaultPeriod},
		{"--share", st.Share, 0.0},
		{"--gray-key", st.GrayKey, service.DefaultGrayKey},
		{"--ratelimit-header-limit", st.HeaderLimit, service.DefaultHeaderLimit},
		{"--ratelimit-header-remaining", st.HeaderRemaining, service.DefaultHeaderRemaining},
		{"--ratelimit-header-reset", st.HeaderReset, service.DefaultHeaderReset},
		{"--refusal-details", !st.NoRefusalDetails, true},
		{"--quota-mode", st.QuotaMode, false},
		{"--response-metadata", st.ResponseMetadata, false},
		{"--max-descriptors", st.MaxDescriptors, service.DefaultMaxDescriptors},
		{"--max-entries", st.MaxEntries, service.DefaultMaxEntries},
		{"--max-value-bytes", st.MaxValueBytes, service.DefaultMaxValueBytes},
		{"--max-metric-values", st.MaxMetricValues, service.DefaultMaxMetricValues},
		{"--max-tenants", st.MaxTenants, service.DefaultMaxTenants},
		{"--top-refused", st.TopRefused, service.DefaultTopRefused},
		{"--max-buckets", st.MaxBuckets, memory.DefaultMaxBuckets},
		{"--log-level", st.LogLevel, slog.LevelInfo},
		{"--log-format", st.LogFormat, flags.LogText},
		{"--xds-node-id", st.XDS.NodeID, xds.DefaultNodeID},
		{"--xds-backoff-min", st.XDS.BackoffMin, xds.DefaultBackoffMin},
		{"--xds-backoff-max", st.XDS.BackoffMax, xds.DefaultBackoffMax},
		{"--xds-max-resources", st.XDS.MaxResources, xds.DefaultMaxResources},
		{"--xds-max-descriptors", st.XDS.MaxDescriptors, xds.DefaultMaxDescriptors},
		{"--xds-max-depth", st.XDS.MaxDepth, xds.DefaultMaxDepth},
		{"--audit-stream", st.Audit.Stream, redisaudit.DefaultStream},
		{"--audit-stream-max-len", st.Audit.MaxLen, int64(redisaudit.DefaultMaxLen)},
	} {
		if d.got != d.want {
			t.Errorf("%s defaults to %v, want %v", d.flag, d.got, d.want)
		}
	}
}

// TestServeEnums: --redis-failure, --log-level and --log-format parse into
// their types, from the command line and from RLS_* alike.
func TestServeEnums(t *testing.T) {
	st, err := flags.ParseServe([]string{"--redis-failure", "deny", "--log-level", "debug", "--log-format", "JSON"}, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if st.RedisFailure != fallback.Deny || st.LogLevel != slog.LevelDebug || st.LogFormat != flags.LogJSON {
		t.Errorf("flags: --redis-failure %v --log-level %v --log-format %v, want deny, DEBUG, json", st.RedisFailure, st.LogLevel, st.LogFormat)
	}
	env := map[string]string{"RLS_REDIS_FAILURE": "local", "RLS_LOG_LEVEL": "warn", "RLS_LOG_FORMAT": "json"}
	st, err = flags.ParseServe(nil, envOf(env), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if st.RedisFailure != fallback.Local || st.LogLevel != slog.LevelWarn || st.LogFormat != flags.LogJSON {
		t.Errorf("env: --redis-failure %v --log-level %v --log-format %v, want local, WARN, json", st.RedisFailure, st.LogLevel, st.LogFormat)
	}
}

func TestParseServeErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want []string
	}{
		{"bad failure mode", []string{"--redis-failure", "maybe"}, nil, []string{"-redis-failure", `"maybe"`, "share, local, allow or deny"}},
		{"bad consistency", []string{"--consistency", "lazy"}, nil, []string{"-consistency", `"lazy"`, "exact or leased"}},
		{"bad failure mode in env", nil, map[string]string{"RLS_REDIS_FAILURE": "maybe"}, []string{"RLS_REDIS_FAILURE", "share, local, allow or deny"}},
		{"bad log level", []string{"--log-level", "loud"}, nil, []string{"-log-level", "loud"}},
		{"bad log format", []string{"--log-format", "xml"}, nil, []string{"-log-format", `"xml"`, "text or json"}},
		{"bad env duration", nil, map[string]string{"RLS_REDIS_TIMEOUT": "soon"}, []string{"RLS_REDIS_TIMEOUT"}},
		{"cert without key", []string{"--tls-cert", "c.pem"}, nil, []string{"--tls-key"}},
		{"zero rule bytes", []string{"--max-rule-bytes", "0"}, nil, []string{"--max-rule-bytes must be ≥ 1"}},
		{"zero buckets", []string{"--max-buckets", "0"}, nil, []string{"--max-* flags ≥ 1"}},
		{"negative top refused", []string{"--top-refused", "-1"}, nil, []string{"--top-refused must be in [0, 256], not -1"}},
		{"huge top refused", nil, map[string]string{"RLS_TOP_REFUSED": "5000"}, []string{"--top-refused must be in [0, 256], not 5000"}},
		{"zero tenants", []string{"--max-tenants", "0"}, nil, []string{"--max-tenants must be in [1, 10000], not 0"}},
		{"huge tenant cap", nil, map[string]string{"RLS_MAX_TENANTS": "100000"}, []string{"--max-tenants must be in [1, 10000], not 100000"}},
		{"stray argument", []string{"extra"}, nil, []string{"no arguments"}},
		{"negative timeout", []string{"--http-idle-timeout", "-1s"}, nil, []string{"--http-"}},
		{"negative conn cap", []string{"--http-max-conns", "-1"}, nil, []string{"--http-max-conns"}},
		{"negative gRPC conn cap", []string{"--grpc-max-conns", "-1"}, nil, []string{"--grpc-max-conns"}},
		{"negative first-call timeout", []string{"--grpc-first-call-timeout", "-1s"}, nil, []string{"--grpc-first-call-timeout"}},
		{"admin CA without admin address", []string{"--tls-cert", "c.pem", "--tls-key", "k.pem", "--admin-addr", "", "--admin-tls-client-ca", "ops.pem"}, nil, []string{"--admin-tls-client-ca needs --admin-addr"}},
		{"no handshake timeout", []string{"--grpc-handshake-timeout", "0"}, nil, []string{"--grpc-handshake-timeout"}},
		{"no redis timeout", []string{"--redis-timeout", "0s"}, nil, []string{"--redis-timeout must be positive"}},
		{"no lease period", []string{"--lease-period", "0s"}, nil, []string{"--lease-period must be positive"}},
		{"negative lease period", []string{"--lease-period", "-1s"}, nil, []string{"--lease-period must be positive"}},
		{"config and xds", []string{"--xds-server", "cp:18001", "--config", "rules.yaml"}, nil, []string{"--config and --xds-server are two sources of rules"}},
		{"config in env and xds", []string{"--xds-server", "cp:18001"}, map[string]string{"RLS_CONFIG": "rules.yaml"}, []string{"--config and --xds-server", "RLS_CONFIG"}},
		{"xds client cert without CA", []string{"--xds-server", "cp:18001", "--xds-tls-cert", "c.pem", "--xds-tls-key", "k.pem"}, nil, []string{"--xds-tls-cert needs --xds-tls-ca"}},
		{"xds cert without key", []string{"--xds-server", "cp:18001", "--xds-tls-ca", "ca.pem", "--xds-tls-cert", "c.pem"}, nil, []string{"--xds-tls-cert and --xds-tls-key go together"}},
		{"xds empty node id", []string{"--xds-server", "cp:18001", "--xds-node-id", ""}, nil, []string{"--xds-node-id must not be empty"}},
		{"xds backoff inverted", []string{"--xds-server", "cp:18001", "--xds-backoff-min", "10s", "--xds-backoff-max", "1s"}, nil, []string{"--xds-backoff-max at least as long"}},
		{"xds depth past rule files'", []string{"--xds-server", "cp:18001", "--xds-max-depth", "65"}, nil, []string{"--xds-max-depth 65: rule files nest at most 64"}},
		{"xds no resources", []string{"--xds-server", "cp:18001"}, map[string]string{"RLS_XDS_MAX_RESOURCES": "0"}, []string{"--xds-max-resources", "must be positive"}},
		{"bad header name", []string{"--ratelimit-header-limit", "Rate Limit"}, nil, []string{"--ratelimit-header-limit", "not a valid HTTP header name"}},
		{"empty header name", []string{"--ratelimit-header-reset="}, nil, []string{"--ratelimit-header-reset"}},
		{"zero audit stream cap", []string{"--audit-stream-max-len", "0"}, nil, []string{"--audit-stream-max-len must be positive"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			_, err := flags.ParseServe(tt.args, envOf(tt.env), &out)
			if err == nil {
				t.Fatalf("ParseServe(%q) succeeded", tt.args)
			}
			// The error is printed too: main does not print usage errors again.
			for _, w := range tt.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("printed %q, want it to mention %q", out.String(), w)
				}
			}
		})
	}
}

func TestServeHelp(t *testing.T) {
	var out bytes.Buffer
	_, err := flags.ParseServe([]string{"-h"}, noEnv, &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v, want flag.ErrHelp", err)
	}
	for _, w := range []string{
		"usage: rls serve",
		"RLS_<FLAG>",
		"-redis-failure mode\n", "while Redis fails: share | local | allow | deny (default share)",
		"-log-format format\n", "log line format: text | json (default text)",
		"-log-level level\n", "(default INFO)",
		"(default 10ms)", // --redis-timeout, from backend/redis
		"-merge-domains",
	} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("help lacks %q:\n%s", w, out.String())
		}
	}
}

func TestEnvName(t *testing.T) {
	if got := flags.EnvName("redis-timeout"); got != "RLS_REDIS_TIMEOUT" {
		t.Errorf("EnvName = %q", got)
	}
}

func TestTracingFlags(t *testing.T) {
	st, err := flags.ParseServe(nil, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if st.TracingEndpoint != "" || st.TracingSampleRatio != 0.01 || st.TracingInsecure {
		t.Errorf("tracing defaults: endpoint %q ratio %v insecure %v; want off, 0.01, false", st.TracingEndpoint, st.TracingSampleRatio, st.TracingInsecure)
	}
	env := map[string]string{"RLS_TRACING_ENDPOINT": "otel:4317", "RLS_TRACING_INSECURE": "true"}
	st, err = flags.ParseServe([]string{"--tracing-sample-ratio", "0.5"}, envOf(env), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if st.TracingEndpoint != "otel:4317" || st.TracingSampleRatio != 0.5 || !st.TracingInsecure {
		t.Errorf("tracing flags: %q %v %v", st.TracingEndpoint, st.TracingSampleRatio, st.TracingInsecure)
	}
	for _, bad := range []string{"-0.5", "1.01", "NaN"} {
		if _, err := flags.ParseServe([]string{"--tracing-sample-ratio", bad}, noEnv, io.Discard); err == nil {
			t.Errorf("--tracing-sample-ratio %s accepted", bad)
		}
	}
}

// TestServeAndValidateShareLoadingFlags: the loading flags of validate are
// serve's, with the same defaults, variables and values.
func TestServeAndValidateShareLoadingFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
	}{
		{[]string{"--config", "rules"}, nil},
		{[]string{"--config", "rules", "--merge-domains", "--max-rule-bytes", "99"}, nil},
		{nil, map[string]string{"RLS_CONFIG": "rules", "RLS_MERGE_DOMAINS": "true", "RLS_MAX_RULE_BYTES": "7"}},
	} {
		st, err := flags.ParseServe(tc.args, envOf(tc.env), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		v, err := flags.ParseValidate(tc.args, envOf(tc.env), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if v.Rules != st.Rules || len(v.Paths) != 1 || v.Paths[0] != "rules" {
			t.Errorf("args %q env %v: validate %+v, serve %+v; want the same loading flags, checking rules", tc.args, tc.env, v, st.Rules)
		}
	}
}

// --share takes 0 ≤ f < 1, from the command line or RLS_SHARE.
func TestShareFlag(t *testing.T) {
	st, err := flags.ParseServe(nil, envOf(map[string]string{"RLS_SHARE": "0.5"}), io.Discard)
	if err != nil || st.Share != 0.5 {
		t.Fatalf("RLS_SHARE=0.5: Share %v, err %v", st.Share, err)
	}
	for _, bad := range []string{"-0.1", "1", "NaN"} {
		if _, err := flags.ParseServe([]string{"--share", bad}, noEnv, io.Discard); err == nil || !strings.Contains(err.Error(), "--share") {
			t.Errorf("--share %s: err %v, want one naming --share", bad, err)
		}
	}
}
