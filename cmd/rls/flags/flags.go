// Package flags holds the command-line flags of `rls serve` and `rls
// validate`: what each one is, its RLS_* environment variable, its default
// and its checks. Defaults that belong to another package (request-size
// limits, the Redis deadline, the bucket cap, the rule-bytes cap) are read
// from that package, never copied; enums are the owning package's types,
// parsed through encoding.TextUnmarshaler (flag.TextVar). The flags of
// `rls serve` are registered onto the fields of node.Options, which owns
// their checks (Options.Validate); Serve adds what the command alone uses.
//
// It is a package of its own, not part of main, so that the example tests
// in envoy-examples can parse the examples' command lines exactly as `rls
// serve` does.
package flags

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/sluice-rls/sluice/backend/lease"
	"github.com/sluice-rls/sluice/backend/memory"
	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/fallback"
	"github.com/sluice-rls/sluice/node"
	"github.com/sluice-rls/sluice/ruleset"
	"github.com/sluice-rls/sluice/service"
	"github.com/sluice-rls/sluice/statsd"
	"github.com/sluice-rls/sluice/tracing"
)

// registerRules registers the rule-loading flags onto r.
func registerRules(fs *flag.FlagSet, r *node.Rules) {
	fs.StringVar(&r.Config, "config", "", "rule file or directory of *.yaml (rls serve without it: the embedded example rules)")
	fs.BoolVar(&r.MergeDomains, "merge-domains", false, "merge rule files that share a domain instead of rejecting them")
	fs.Int64Var(&r.MaxRuleBytes, "max-rule-bytes", ruleset.DefaultMaxRuleBytes, "most bytes read from all rule files together in one load; a larger rule set is refused")
	fs.StringVar(&r.GrayKey, "gray-key", service.DefaultGrayKey, "descriptor key whose value true marks a gray (canary) request, which gets doubled local limits; empty: no gray marker")
}

// Serve are the flags of `rls serve`: the node's options, and what the
// command itself uses (the logger's level and format, the refusal of the
// embedded rules in Kubernetes, envoyproxy/ratelimit's variables). Every
// flag has an environment variable RLS_<FLAG> (dashes become underscores,
// upper case); a flag given on the command line wins over its variable.
type Serve struct {
	node.Options

	LogLevel  slog.Level
	LogFormat LogFormat
	// ExampleRules lets rls serve run without --config in Kubernetes,
	// serving the embedded example rules.
	ExampleRules bool
	// PeerEnv is what to do with envoyproxy/ratelimit's environment
	// variables; PeerNotes are the lines to log about them at start.
	PeerEnv   PeerEnvMode
	PeerNotes []PeerNote
}

// ParseServe parses the flags of `rls serve` from args, taking defaults from
// the environment through getenv. Every error is also printed to out (the
// flag package's with the usage). -h and --help print the usage and return
// flag.ErrHelp.
func ParseServe(args []string, getenv func(string) string, out io.Writer) (Serve, error) {
	var s Serve
	fs := newServeFlagSet(&s, out)
	if err := parse(fs, args, getenv); err != nil {
		return s, err
	}
	var err error
	if fs.NArg() > 0 {
		err = fmt.Errorf("serve takes no arguments, got %q", fs.Args())
	} else if s.PeerNotes, err = applyPeerEnv(fs, s.PeerEnv, getenv, explicitFlags(fs, getenv)); err == nil {
		// After the peer's variables: those it mapped win too.
		given := explicitFlags(fs, getenv)
		if peerTracingOff(s.PeerEnv, getenv) {
			given["tracing-endpoint"] = true
		}
		if err = applyOTelEnv(fs, getenv, given); err == nil {
			if peerTracingOn(s.PeerEnv, getenv) && s.TracingEndpoint == "" {
				err = errors.New("TRACING_ENABLED=true (envoyproxy/ratelimit) names no collector: set OTEL_EXPORTER_OTLP_ENDPOINT, which the peer reads too, or --tracing-endpoint")
			} else {
				err = s.Validate()
			}
		}
	}
	if err == nil && s.Config == "" && s.XDS.Server == "" && !s.ExampleRules && getenv("KUBERNETES_SERVICE_HOST") != "" {
		err = errExampleRulesInKubernetes
	}
	if err != nil {
		fmt.Fprintln(out, "rls serve:", err)
	}
	return s, err
}

// newServeFlagSet registers the flags of `rls serve` onto s, in a flag set
// printing its errors and usage to out.
func newServeFlagSet(s *Serve, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(out, "usage: rls serve [flags]\n\nEvery flag has an environment variable RLS_<FLAG> (--redis-timeout: RLS_REDIS_TIMEOUT);\na flag on the command line wins.\n\n")
		fs.PrintDefaults()
	}
	fs.StringVar(&s.GRPCAddr, "grpc-addr", ":8081", "gRPC listen address (RateLimitService v3 and grpc.health.v1): host:port, or a unix socket unix:path or unix:///absolute/path")
	fs.StringVar(&s.HTTPAddr, "http-addr", ":8080", "HTTP listen address (/healthcheck, /metrics, /rlconfig): host:port or unix:path")
	fs.StringVar(&s.MetricsAddr, "metrics-addr", "", "a listen address of its own for /metrics (also on --http-addr), as envoyproxy/ratelimit's PROMETHEUS_ADDR: host:port or unix:path; empty: off")
	fs.StringVar(&s.MetricsPath, "metrics-path", "/metrics", "the `path` of /metrics on --metrics-addr")
	fs.StringVar(&s.AdminAddr, "admin-addr", "127.0.0.1:8082", "admin listen address (/json, and /debug/pprof/ with --pprof): host:port or unix:path; TLS/mTLS as gRPC when --tls-cert is set; empty: off")
	fs.BoolVar(&s.JSONNegativeHits, "json-negative-hits", false, "accept is_negative_hits (token refunds) on /json; refused with 403 otherwise")
	fs.DurationVar(&s.HTTPReadTimeout, "http-read-timeout", 5*time.Second, "HTTP and admin: longest time to read a request, headers and body (0: none)")
	fs.DurationVar(&s.HTTPWriteTimeout, "http-write-timeout", 10*time.Second, "HTTP and admin: longest time to answer a request (0: none; pprof profiles and traces get their duration on top)")
	fs.DurationVar(&s.HTTPIdleTimeout, "http-idle-timeout", 30*time.Second, "HTTP and admin: how long a keep-alive connection may wait for its next request (0: --http-read-timeout)")
	fs.IntVar(&s.HTTPMaxConns, "http-max-conns", 128, "HTTP and admin: most open connections per listener; more wait in the kernel's backlog (0: no cap)")
	fs.DurationVar(&s.GRPCHandshakeTimeout, "grpc-handshake-timeout", 5*time.Second, "gRPC: longest time for a new connection's TLS handshake and HTTP/2 preface")
	fs.DurationVar(&s.GRPCMaxConnIdle, "grpc-max-conn-idle", 2*time.Minute, "gRPC: close (GOAWAY) connections without a call for this long (0: never)")
	fs.DurationVar(&s.GRPCMaxConnAge, "grpc-max-conn-age", time.Hour, "gRPC: close (GOAWAY) connections this old (±10%), so that clients such as Envoy reconnect and spread over new replicas (0: never)")
	fs.DurationVar(&s.GRPCMaxConnAgeGrace, "grpc-max-conn-age-grace", 10*time.Second, "gRPC: how long calls in flight at --grpc-max-conn-age may still run before the connection is closed (0: no bound)")
	fs.IntVar(&s.GRPCMaxConns, "grpc-max-conns", 4096, "gRPC: most open connections on the listener; more wait in the kernel's backlog (0: no cap). Envoy opens about one connection per worker thread to each replica, so 4096 is ~500 Envoys of 8 workers; each connection is a file descriptor, keep the cap below the process' limit")
	fs.DurationVar(&s.GRPCFirstCallTimeout, "grpc-first-call-timeout", 5*time.Second, "gRPC: close a new connection that starts no call within this (after TLS and the HTTP/2 preface); Envoy sends its first call at once (0: never, for clients that connect ahead of calls)")
	fs.DurationVar(&s.GRPCKeepaliveMinTime, "grpc-keepalive-min-time", 10*time.Second, "gRPC: clients may send keepalive pings this often, with or without calls; faster ones are disconnected")
	registerRules(fs, &s.Rules)
	registerXDS(fs, &s.XDS)
	registerEmergency(fs, &s.Emergency)
	registerAudit(fs, &s.Audit)
	registerOverrides(fs, &s.Overrides)
	registerAdaptive(fs, &s.AdaptiveConfig)
	fs.StringVar(&s.Redis, "redis", "", "Redis URL for the global layer: redis://, rediss://, unix:///path/redis.sock, a comma list (cluster) or sentinel://master@host:port,... (default: memory backend)")
	fs.StringVar(&s.RedisCA, "redis-ca", "", "CA bundle (PEM) to verify Redis' TLS certificate with rediss:// (default: the system roots)")
	fs.StringVar(&s.RedisTLSCert, "redis-tls-cert", "", "client certificate (PEM) presented to Redis over TLS (Redis' tls-auth-clients); read again when the file changes")
	fs.StringVar(&s.RedisTLSKey, "redis-tls-key", "", "private key (PEM) of --redis-tls-cert")
	fs.DurationVar(&s.RedisTimeout, "redis-timeout", redisbackend.DefaultTimeout, "deadline of every Redis call")
	fs.TextVar(&s.RedisFailure, "redis-failure", fallback.Share, "`mode` of the global layer while Redis fails: "+modeList())
	fs.TextVar(&s.Consistency, "consistency", lease.DefaultConsistency, "`mode` of global buckets whose rule sets no consistency: exact (Redis decides every request) or leased (nodes decide from tokens leased from Redis; docs/design.md)")
	fs.Float64Var(&s.Share, "share", 0, "part f (0 ≤ f < 1) of the global limit held as standing shares by every rule that may hold them and sets no rate_limit.share: each node decides f/n of each key without Redis (0: none; docs/decisions/0021-standing-shares.md)")
	fs.DurationVar(&s.LeasePeriod, "lease-period", lease.DefaultPeriod, "how long a node keeps unused tokens leased from a global bucket before giving them back; a lease is at most what the limit refills in this time")
	fs.IntVar(&s.FallbackNodes, "fallback-nodes", 0, "node count N for the fallback share rate/N (0: live count from Redis heartbeats)")
	fs.IntVar(&s.FallbackNodesInitial, "fallback-nodes-initial", 0, fmt.Sprintf("N for the fallback share until this node has read the node registry, e.g. the most replicas (0: %d)", node.DefaultFallbackNodesInitial))
	fs.BoolVar(&s.Shadow, "shadow", false, "shadow mode for every rule: decide and count, always answer OK")
	fs.BoolVar(&s.QuotaMode, "quota-mode", false, "quota mode for every rule: a request is refused only when all its limited descriptors are (as a rule's quota_mode)")
	fs.BoolVar(&s.ResponseMetadata, "response-metadata", false, "set the response's dynamic metadata: domain, descriptors, hits_addend and the metadata of the rules answered OK")
	fs.BoolVar(&s.RateLimitHeaders, "ratelimit-headers", false, "add draft-03 RateLimit-Limit/Remaining/Reset headers to every response")
	fs.StringVar(&s.HeaderLimit, "ratelimit-header-limit", service.DefaultHeaderLimit, "name of the limit header of --ratelimit-headers")
	fs.StringVar(&s.HeaderRemaining, "ratelimit-header-remaining", service.DefaultHeaderRemaining, "name of the remaining header of --ratelimit-headers")
	fs.StringVar(&s.HeaderReset, "ratelimit-header-reset", service.DefaultHeaderReset, "name of the reset header of --ratelimit-headers")
	fs.Var(notBool{&s.NoRefusalDetails}, "refusal-details", "add retry-after, x-ratelimit-retry-after-ms, -layer, -gray and a JSON body to refusals (false: envoyproxy/ratelimit's bare refusal)")
	fs.IntVar(&s.MaxDescriptors, "max-descriptors", service.DefaultMaxDescriptors, "most descriptors in one request")
	fs.IntVar(&s.MaxEntries, "max-entries", service.DefaultMaxEntries, "most entries in one descriptor")
	fs.IntVar(&s.MaxValueBytes, "max-value-bytes", service.DefaultMaxValueBytes, "keys and values longer than this (bytes) are limited by their SHA-256 digest")
	fs.IntVar(&s.MaxBuckets, "max-buckets", memory.DefaultMaxBuckets, "most partly drained buckets per memory backend (about 80 B of heap each, budget 200 B of process memory); when full, requests needing a new bucket are refused")
	fs.IntVar(&s.MaxMetricValues, "max-metric-values", service.DefaultMaxMetricValues, "most rule labels carrying request values (detailed_metric, value_to_metric); more are counted as <rule>:overflow")
	fs.IntVar(&s.MaxTenants, "max-tenants", service.DefaultMaxTenants, fmt.Sprintf("per rule with utilisation: most tenants with a ratelimit_tenant_consumed_tokens_total series of their own, the first seen; later ones are counted together under tenant=\"_other\" (at most %d)", node.MaxTenantsBound))
	fs.TextVar(&s.LogLevel, "log-level", slog.LevelInfo, "least `level` logged: debug | info | warn | error")
	fs.TextVar(&s.LogFormat, "log-format", LogText, "log line `format`: "+formatList())
	fs.IntVar(&s.RefusalLogEvery, "log-refusals", 100, "log one refused request in N, with domain, rule and descriptor values (0: none)")
	fs.IntVar(&s.TopRefused, "top-refused", service.DefaultTopRefused, fmt.Sprintf("keep the values refused most per rule over the last %d minutes, this many per rule and minute, for /usage/top on the admin address; values may be personal data (0: off, at most %d)", service.TopRefusedMinutes, node.MaxTopRefused))
	fs.BoolVar(&s.Pprof, "pprof", false, "serve /debug/pprof/ on the admin address (--admin-addr)")
	fs.StringVar(&s.TLSCert, "tls-cert", "", "gRPC (and admin) server certificate (PEM); enables TLS; read again when the files change")
	fs.StringVar(&s.TLSKey, "tls-key", "", "gRPC server private key (PEM)")
	fs.StringVar(&s.TLSClientCA, "tls-client-ca", "", "CA bundle (PEM) for client certificates; enables mTLS")
	fs.StringVar(&s.TLSClientSAN, "tls-client-san", "", "with mTLS, comma-separated names a client certificate must carry one of: DNS name (wildcard SANs match), IP, or URI with :// such as a SPIFFE ID (default: any certificate the CA signed)")
	fs.StringVar(&s.AdminTLSClientCA, "admin-tls-client-ca", "", "CA bundle (PEM) for operators' client certificates on the admin address (needs --tls-cert); enables mTLS there, and the certificate's subject authors /overrides calls. --tls-client-ca (Envoy's) never applies to the admin address; with it, a non-loopback --admin-addr needs this flag")
	fs.StringVar(&s.AdminTLSClientSAN, "admin-tls-client-san", "", "with --admin-tls-client-ca, comma-separated names an operator's certificate must carry one of, as --tls-client-san (default: any certificate that CA signed)")
	fs.DurationVar(&s.DrainTimeout, "drain-timeout", 10*time.Second, "on SIGTERM, how long in-flight calls may take to finish")
	fs.StringVar(&s.TracingEndpoint, "tracing-endpoint", "", "OpenTelemetry collector to send traces to: host:port, or a URL (http://: plaintext); checked at start with an empty export (default: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT, else tracing off)")
	fs.StringVar(&s.TracingProtocol, "tracing-protocol", tracing.ProtocolGRPC, "OTLP `protocol` to --tracing-endpoint: grpc | http/protobuf (default: OTEL_EXPORTER_OTLP_PROTOCOL; http/protobuf when the endpoint is OTEL_EXPORTER_OTLP_ENDPOINT's, else grpc)")
	fs.Float64Var(&s.TracingSampleRatio, "tracing-sample-ratio", node.DefaultTracingSampleRatio, "share of requests traced when Envoy sent no trace context, in [0, 1]; Envoy's sampling decision wins when it sent one (default: from OTEL_TRACES_SAMPLER=parentbased_*)")
	fs.TextVar(&s.TracingResource, "tracing-resource", tracing.Resource(nil), "resource `attributes` of the spans, as OTEL_RESOURCE_ATTRIBUTES writes them (service.name=edge,service.namespace=gw), over OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES (default: service.name=sluice)")
	fs.BoolVar(&s.TracingInsecure, "tracing-insecure", false, "send traces without TLS to a host:port --tracing-endpoint (a URL says it by its scheme, http://)")
	fs.StringVar(&s.Statsd.Addr, "statsd-addr", "", "statsd server host:port (UDP) to send envoyproxy/ratelimit's counters to (ratelimit.service.rate_limit.<rule>.total_hits, ...; docs/metrics.md); default: none")
	fs.DurationVar(&s.Statsd.Interval, "statsd-interval", statsd.DefaultInterval, "how often --statsd-addr gets the counters' increases")
	fs.BoolVar(&s.ExampleRules, "example-rules", false, "without --config, serve the embedded example rules even in Kubernetes (KUBERNETES_SERVICE_HOST set), where rls serve refuses to otherwise")
	fs.TextVar(&s.PeerEnv, "peer-env", PeerEnvMap, "`mode` for envoyproxy/ratelimit's environment variables (REDIS_URL, RUNTIME_ROOT, ...): map (use those that mean the same as a flag, refuse the others) | refuse (refuse to start while any is set) | ignore (log a warning for each)")
	return fs
}

// errExampleRulesInKubernetes refuses the embedded example rules in a
// Kubernetes pod: there, a missing --config is a mistake in the manifest,
// and the examples would limit real traffic by rules nobody wrote for it.
var errExampleRulesInKubernetes = errors.New("no --config nor --xds-server (nor RUNTIME_ROOT or CONFIG_TYPE): rls serve would serve its embedded example rules, and KUBERNETES_SERVICE_HOST says this is a Kubernetes pod; give --config or --xds-server, or --example-rules to serve the examples anyway")

// explicitFlags are the flags of fs given on the command line or by their
// RLS_<FLAG> variable: settings envoyproxy/ratelimit's variables never
// override.
func explicitFlags(fs *flag.FlagSet, getenv func(string) string) map[string]bool {
	given := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { given[f.Name] = getenv(EnvName(f.Name)) != "" })
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	return given
}

// Validate are the flags and arguments of `rls validate`.
type Validate struct {
	node.Rules // the same loading flags as rls serve
	// Strict makes warnings failures: what envoyproxy/ratelimit loads but
	// sluice finds suspect (descriptors.Config.Warnings), for CI.
	Strict bool
	// Paths are the rule files and directories checked together as one
	// rule set: the PATH arguments, or --config when there are none.
	// Empty when only AdaptiveConfig is to be checked.
	Paths []string
	// AdaptiveConfig is a file of adaptive limits to check too (rls
	// serve's --adaptive-config), against the rules of Paths if any.
	AdaptiveConfig string
}

const validateUsage = `usage: rls validate [flags] PATH...

Checks the rule files at PATH (each a file or a directory of *.yaml, as
rls serve --config) together, as the one rule set rls serve would load from a
directory holding them all: a domain defined in two files fails unless
--merge-domains. Every problem is printed as file:line:column: reason.
Without PATH it checks --config. Warnings (what envoyproxy/ratelimit loads
but sluice finds suspect) are printed and do not fail, unless --strict. The
flags, before or after PATH, are rls serve's loading flags, with their
RLS_<FLAG> variables, and --strict; PATH arguments win over RLS_CONFIG.

--adaptive-config FILE (RLS_ADAPTIVE_CONFIG) checks a file of adaptive limits
too, as rls serve reads it, printing every problem as file:line: reason; with
rules, a policy whose domain or rule they lack, or that would raise a
protected rule, is a warning. Without PATH or --config it checks FILE alone.

Exit status: 0 when everything checked is valid, 1 on a problem (or a warning
with --strict), 2 on a usage error or a file that cannot be read.

`

// errNoPaths is ParseValidate's error when it has nothing to check.
var errNoPaths = errors.New("nothing to check: give PATH arguments, --config or --adaptive-config")

// ParseValidate parses the flags and arguments of `rls validate`, taking
// the loading flags' defaults from the environment through getenv, as
// ParseServe does. Errors and the usage are printed to out; -h and --help
// print the usage and return flag.ErrHelp.
func ParseValidate(args []string, getenv func(string) string, out io.Writer) (Validate, error) {
	var v Validate
	fs := newValidateFlagSet(&v, out)
	if err := parse(fs, args, getenv); err != nil {
		return v, err
	}
	configFlag := false // --config on the command line, not from RLS_CONFIG
	fs.Visit(func(f *flag.Flag) { configFlag = configFlag || f.Name == "config" })
	err := v.Rules.Validate()
	switch {
	case err != nil:
	case fs.NArg() > 0 && configFlag:
		err = fmt.Errorf("give the rules as PATH arguments or as --config, not both")
	case fs.NArg() > 0:
		v.Paths = fs.Args()
	case v.Config != "":
		v.Paths = []string{v.Config}
	case v.AdaptiveConfig != "": // the adaptive-limits file alone
	default:
		fs.Usage()
		err = errNoPaths
	}
	if err != nil {
		fmt.Fprintln(out, "rls validate:", err)
	}
	return v, err
}

// newValidateFlagSet registers the flags of `rls validate` onto v, in a flag
// set printing its errors and usage to out.
func newValidateFlagSet(v *Validate, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("validate", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(out, validateUsage)
		fs.PrintDefaults()
	}
	registerRules(fs, &v.Rules)
	registerAdaptive(fs, &v.AdaptiveConfig)
	fs.BoolVar(&v.Strict, "strict", false, "fail (exit 1) on warnings too, not only on errors: for CI")
	return fs
}

// parse sets the flags of fs from their RLS_* variables, read through
// getenv, then from args: a flag on the command line wins over its
// variable. The flag package prints its own errors, with the usage.
func parse(fs *flag.FlagSet, args []string, getenv func(string) string) error {
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
	if err := ParseInterspersed(fs, args); err != nil {
		return err
	}
	if envErr != nil {
		fmt.Fprintf(fs.Output(), "rls %s: %v\n", fs.Name(), envErr)
	}
	return envErr
}

// EnvName is the environment variable of a flag: redis-timeout →
// RLS_REDIS_TIMEOUT.
func EnvName(flagName string) string {
	return "RLS_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// modeList is the --redis-failure values for the help text.
func modeList() string {
	var names []string
	for _, m := range fallback.Modes() {
		names = append(names, m.String())
	}
	return strings.Join(names, " | ")
}
