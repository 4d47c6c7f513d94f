package config

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
)

// Settings are the flags of `rls serve`. Every flag has an environment
// variable RLS_<FLAG> (dashes become underscores, upper case); a flag given
// on the command line wins over its variable.
type Settings struct {
	GRPCAddr string
	HTTPAddr string
	Config   string // rule file or directory; empty = embedded example
	// MaxRuleBytes caps the bytes read from all rule files in one load.
	MaxRuleBytes int64

	// The admin listener: /json and /debug/pprof/, which spend tokens or
	// expose internals. Loopback by default; TLS (and mTLS) as gRPC when
	// --tls-cert is set. Empty: not served.
	AdminAddr        string
	JSONNegativeHits bool // accept is_negative_hits on /json (refills buckets)

	// Connection limits, so that slow or idle clients cannot hold the
	// descriptors new gRPC calls need. 0 turns an HTTP limit off.
	HTTPReadTimeout      time.Duration // a whole request, headers and body
	HTTPWriteTimeout     time.Duration // a response (pprof profiles get their duration on top)
	HTTPIdleTimeout      time.Duration // a keep-alive connection between requests
	HTTPMaxConns         int           // open connections per HTTP listener (HTTP and admin)
	GRPCHandshakeTimeout time.Duration // TLS and HTTP/2 preface of a new connection
	GRPCMaxConnIdle      time.Duration // a connection without a call for this long gets GOAWAY; 0: never
	GRPCKeepaliveMinTime time.Duration // clients pinging more often are disconnected

	Redis         string
	RedisCA       string // PEM bundle trusted for rediss:// (default: the system roots)
	RedisTimeout  time.Duration
	RedisFailure  string // share | local | allow | deny
	FallbackNodes int
	// FallbackNodesInitial is N until the node has read the node registry
	// (0: the built-in default).
	FallbackNodesInitial int

	Shadow           bool
	GrayKey          string
	MergeDomains     bool
	RateLimitHeaders bool

	MaxDescriptors int
	MaxEntries     int
	MaxValueBytes  int
	MaxBuckets     int
	// MaxMetricValues caps the rule labels carrying request values.
	MaxMetricValues int

	LogLevel    string
	LogFormat   string
	LogRefusals int
	Pprof       bool

	TLSCert     string
	TLSKey      string
	TLSClientCA string

	DrainTimeout time.Duration

	// OpenTelemetry tracing over OTLP/gRPC: off while TracingEndpoint is
	// empty. TracingSampleRatio samples root traces; a request Envoy sent
	// with a sampled traceparent is always traced.
	TracingEndpoint    string
	TracingSampleRatio float64
	TracingInsecure    bool
}

// Redis failure modes (--redis-failure).
const (
	FailureShare = "share"
	FailureLocal = "local"
	FailureAllow = "allow"
	FailureDeny  = "deny"
)

// ParseServe parses the flags of `rls serve` from args, taking defaults from
// the environment through getenv. Every error is also printed to out (the
// flag package's with the usage).
func ParseServe(args []string, getenv func(string) string, out io.Writer) (Settings, error) {
	var s Settings
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(out, "usage: rls serve [flags]\n\nEvery flag has an environment variable RLS_<FLAG> (--redis-timeout: RLS_REDIS_TIMEOUT);\na flag on the command line wins.\n\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&s.GRPCAddr, "grpc-addr", ":8081", "gRPC listen address (RateLimitService v3 and grpc.health.v1)")
	fs.StringVar(&s.HTTPAddr, "http-addr", ":8080", "HTTP listen address (/healthcheck, /metrics, /rlconfig)")
	fs.StringVar(&s.AdminAddr, "admin-addr", "127.0.0.1:8082", "admin listen address (/json, and /debug/pprof/ with --pprof); TLS/mTLS as gRPC when --tls-cert is set; empty: off")
	fs.BoolVar(&s.JSONNegativeHits, "json-negative-hits", false, "accept is_negative_hits (token refunds) on /json; refused with 403 otherwise")
	fs.DurationVar(&s.HTTPReadTimeout, "http-read-timeout", 5*time.Second, "HTTP and admin: longest time to read a request, headers and body (0: none)")
	fs.DurationVar(&s.HTTPWriteTimeout, "http-write-timeout", 10*time.Second, "HTTP and admin: longest time to answer a request (0: none; pprof profiles and traces get their duration on top)")
	fs.DurationVar(&s.HTTPIdleTimeout, "http-idle-timeout", 30*time.Second, "HTTP and admin: how long a keep-alive connection may wait for its next request (0: --http-read-timeout)")
	fs.IntVar(&s.HTTPMaxConns, "http-max-conns", 128, "HTTP and admin: most open connections per listener; more wait in the kernel's backlog (0: no cap)")
	fs.DurationVar(&s.GRPCHandshakeTimeout, "grpc-handshake-timeout", 5*time.Second, "gRPC: longest time for a new connection's TLS handshake and HTTP/2 preface")
	fs.DurationVar(&s.GRPCMaxConnIdle, "grpc-max-conn-idle", 2*time.Minute, "gRPC: close (GOAWAY) connections without a call for this long (0: never)")
	fs.DurationVar(&s.GRPCKeepaliveMinTime, "grpc-keepalive-min-time", 10*time.Second, "gRPC: clients may send keepalive pings this often, with or without calls; faster ones are disconnected")
	fs.StringVar(&s.Config, "config", "", "rule file or directory of *.yaml (default: the embedded example)")
	fs.Int64Var(&s.MaxRuleBytes, "max-rule-bytes", DefaultMaxRuleBytes, "most bytes read from all rule files together in one load; a larger rule set is refused")
	fs.StringVar(&s.Redis, "redis", "", "Redis URL for the global layer: redis://, rediss://, a comma list (cluster) or sentinel://master@host:port,... (default: memory backend)")
	fs.StringVar(&s.RedisCA, "redis-ca", "", "CA bundle (PEM) to verify Redis' TLS certificate with rediss:// (default: the system roots)")
	fs.DurationVar(&s.RedisTimeout, "redis-timeout", 10*time.Millisecond, "deadline of every Redis call")
	fs.StringVar(&s.RedisFailure, "redis-failure", FailureShare, "when Redis fails: share | local | allow | deny")
	fs.IntVar(&s.FallbackNodes, "fallback-nodes", 0, "node count N for the fallback share rate/N (0: live count from Redis heartbeats)")
	fs.IntVar(&s.FallbackNodesInitial, "fallback-nodes-initial", 0, "N for the fallback share until this node has read the node registry, e.g. the most replicas (0: 10)")
	fs.BoolVar(&s.Shadow, "shadow", false, "shadow mode for every rule: decide and count, always answer OK")
	fs.StringVar(&s.GrayKey, "gray-key", "gray", "descriptor key whose value true marks a gray (canary) request")
	fs.BoolVar(&s.MergeDomains, "merge-domains", false, "merge rule files that share a domain instead of rejecting them")
	fs.BoolVar(&s.RateLimitHeaders, "ratelimit-headers", false, "add draft-03 RateLimit-Limit/Remaining/Reset headers to every response")
	fs.IntVar(&s.MaxDescriptors, "max-descriptors", 256, "most descriptors in one request")
	fs.IntVar(&s.MaxEntries, "max-entries", 32, "most entries in one descriptor")
	fs.IntVar(&s.MaxValueBytes, "max-value-bytes", 1024, "keys and values longer than this (bytes) are limited by their SHA-256 digest")
	fs.IntVar(&s.MaxBuckets, "max-buckets", 1<<20, "most partly drained buckets per memory backend (about 80 B of heap each, budget 200 B of process memory); when full, requests needing a new bucket are refused")
	fs.IntVar(&s.MaxMetricValues, "max-metric-values", 1000, "most rule labels carrying request values (detailed_metric, value_to_metric); more are counted as <rule>:overflow")
	fs.StringVar(&s.LogLevel, "log-level", "info", "debug | info | warn | error")
	fs.StringVar(&s.LogFormat, "log-format", "text", "text | json")
	fs.IntVar(&s.LogRefusals, "log-refusals", 100, "log one refused request in N, with domain, rule and descriptor values (0: none)")
	fs.BoolVar(&s.Pprof, "pprof", false, "serve /debug/pprof/ on the admin address (--admin-addr)")
	fs.StringVar(&s.TLSCert, "tls-cert", "", "gRPC server certificate (PEM); enables TLS")
	fs.StringVar(&s.TLSKey, "tls-key", "", "gRPC server private key (PEM)")
	fs.StringVar(&s.TLSClientCA, "tls-client-ca", "", "CA bundle (PEM) for client certificates; enables mTLS")
	fs.DurationVar(&s.DrainTimeout, "drain-timeout", 10*time.Second, "on SIGTERM, how long in-flight calls may take to finish")
	fs.StringVar(&s.TracingEndpoint, "tracing-endpoint", "", "OpenTelemetry collector (OTLP/gRPC) host:port to send traces to (default: tracing off)")
	fs.Float64Var(&s.TracingSampleRatio, "tracing-sample-ratio", 0.01, "share of requests traced when Envoy sent no trace context, in [0, 1]; Envoy's sampling decision wins when it sent one")
	fs.BoolVar(&s.TracingInsecure, "tracing-insecure", false, "send traces without TLS (plaintext gRPC) to --tracing-endpoint")

	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		v := getenv(EnvName(f.Name))
		if v == "" || envErr != nil {
			return
		}
		if err := f.Value.Set(v); err != nil {
			envErr = fmt.Errorf("%s=%q: %w", EnvName(f.Name), v, err)
		}
	})
	if err := fs.Parse(args); err != nil {
		return s, err // the flag package has printed it, with the usage
	}
	err := envErr
	if err == nil && fs.NArg() > 0 {
		err = fmt.Errorf("serve takes no arguments, got %q", fs.Args())
	}
	if err == nil {
		err = s.validate()
	}
	if err != nil {
		fmt.Fprintln(out, "rls serve:", err)
	}
	return s, err
}

// EnvName is the environment variable of a flag: redis-timeout →
// RLS_REDIS_TIMEOUT.
func EnvName(flagName string) string {
	return "RLS_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func (s Settings) validate() error {
	switch s.RedisFailure {
	case FailureShare, FailureLocal, FailureAllow, FailureDeny:
	default:
		return fmt.Errorf("--redis-failure must be share, local, allow or deny, not %q", s.RedisFailure)
	}
	if s.RedisTimeout <= 0 {
		return fmt.Errorf("--redis-timeout must be positive, not %v", s.RedisTimeout)
	}
	if (s.TLSCert == "") != (s.TLSKey == "") {
		return fmt.Errorf("--tls-cert and --tls-key go together")
	}
	if s.TLSClientCA != "" && s.TLSCert == "" {
		return fmt.Errorf("--tls-client-ca needs --tls-cert and --tls-key")
	}
	if s.HTTPReadTimeout < 0 || s.HTTPWriteTimeout < 0 || s.HTTPIdleTimeout < 0 || s.HTTPMaxConns < 0 || s.GRPCMaxConnIdle < 0 || s.GRPCKeepaliveMinTime < 0 {
		return fmt.Errorf("--http-*-timeout, --http-max-conns, --grpc-max-conn-idle and --grpc-keepalive-min-time must be ≥ 0")
	}
	if s.GRPCHandshakeTimeout <= 0 {
		return fmt.Errorf("--grpc-handshake-timeout must be positive, not %v", s.GRPCHandshakeTimeout)
	}
	if !(s.TracingSampleRatio >= 0 && s.TracingSampleRatio <= 1) {
		return fmt.Errorf("--tracing-sample-ratio must be in [0, 1], not %v", s.TracingSampleRatio)
	}
	if s.FallbackNodes < 0 || s.FallbackNodesInitial < 0 || s.MaxDescriptors < 1 || s.MaxEntries < 1 || s.MaxValueBytes < 1 || s.MaxBuckets < 1 ||
		s.MaxRuleBytes < 1 || s.MaxMetricValues < 1 || s.LogRefusals < 0 {
		return fmt.Errorf("--fallback-nodes and --fallback-nodes-initial must be ≥ 0 and --max-* flags ≥ 1")
	}
	return nil
}
