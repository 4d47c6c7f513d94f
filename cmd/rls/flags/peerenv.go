package flags

import (
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/sluice-rls/sluice/tracing"
)

// This file reads the environment variables of envoyproxy/ratelimit (the
// peer: the reference implementation of Envoy's rate-limit service, whose
// deployments set them) so that a deployment switched to rls serve never
// loses one silently. peerVars lists every variable of the peer's
// src/settings/settings.go (testdata/envoy-ratelimit-settings.txt is the
// hand-copied list the tests compare it with); each one is
//
//   - mapped: it feeds a sluice flag of the same meaning (peerMaps converts
//     the value where the formats differ), unless that flag is given on the
//     command line or as RLS_<FLAG>: explicit sluice settings win;
//   - accepted: only for the values listed in ok, which change nothing
//     (mostly the peer's default, where sluice behaves the same), or while
//     the peer itself would not read it (inert: statsd settings with
//     USE_STATSD=false, ...); any other value is refused;
//   - refused: rls serve does not start, and says which flag to use or why
//     the setting has no equivalent. A refusal naming a flag is lifted by
//     giving that flag.
//
// --peer-env=refuse refuses every peer variable that is set, and
// --peer-env=ignore only logs them (a warning each).

// PeerEnvMode is --peer-env: what rls serve does with envoyproxy/ratelimit's
// environment variables.
type PeerEnvMode int

const (
	PeerEnvMap    PeerEnvMode = iota // map, accept or refuse each (the default)
	PeerEnvRefuse                    // refuse to start while any is set
	PeerEnvIgnore                    // log a warning for each, use none
)

var peerEnvModes = []PeerEnvMode{PeerEnvMap, PeerEnvRefuse, PeerEnvIgnore}

// String returns the --peer-env spelling of m.
func (m PeerEnvMode) String() string {
	switch m {
	case PeerEnvRefuse:
		return "refuse"
	case PeerEnvIgnore:
		return "ignore"
	}
	return "map"
}

// MarshalText implements encoding.TextMarshaler, for flag.TextVar.
func (m PeerEnvMode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler: it parses a --peer-env
// value, in any case.
func (m *PeerEnvMode) UnmarshalText(b []byte) error {
	for _, c := range peerEnvModes {
		if strings.EqualFold(c.String(), string(b)) {
			*m = c
			return nil
		}
	}
	return fmt.Errorf("unknown --peer-env %q (want map, refuse or ignore)", b)
}

// PeerNote is a line rls serve logs at start about one of envoyproxy/
// ratelimit's environment variables: how it was mapped, why it was
// accepted or ignored. ParseServe runs before the logger exists, so it
// returns them in Serve.PeerNotes.
type PeerNote struct {
	Level slog.Level
	Msg   string
	Args  []any // slog key-value pairs
}

// peerKind says how the peer parses a variable, so that "0.80" equals the
// default "0.8" and "TRUE" equals "true".
type peerKind int

const (
	kText     peerKind = iota // compared as written
	kWord                     // an enum: compared ignoring case
	kBool                     // strconv.ParseBool, as envconfig
	kNumber                   // an int or float
	kDuration                 // time.ParseDuration
)

// peerHow is what rls serve does with a peer variable that is set.
type peerHow int

const (
	hMapped   peerHow = iota // feeds flag through a peerMaps entry
	hAccepted                // only the values in ok (and while inert)
	hRefused                 // refused, naming flag when there is one
)

// peerVar is one environment variable of envoyproxy/ratelimit.
type peerVar struct {
	name string
	def  string // the peer's default, as its settings.go declares it
	kind peerKind
	how  peerHow
	// flag is the sluice flag the variable maps to (hMapped) or that
	// replaces it (hRefused, hAccepted): giving it lifts a refusal.
	flag string
	ok   []string // values accepted as they are (they change nothing)
	// anyOK accepts every value of the kind: sluice always does what the
	// variable turns on.
	anyOK bool
	// inert reports, when the peer itself would not read the variable in
	// this environment, why (USE_STATSD=false, ...); such a variable is
	// accepted with any value.
	inert  func(getenv func(string) string) string
	why    string // accepted: what sluice does instead; refused: why
	secret bool   // never print the value
	// warn logs the acceptance of a value not in ok as a warning: sluice
	// does something else than the peer, which the operator must know.
	warn bool
}

// Conditions under which the peer does not read a variable.
func whenFalse(name, def, what string) func(func(string) string) string {
	return func(getenv func(string) string) string {
		if !peerBool(getenv, name, def) {
			return what + " (" + name + " is false)"
		}
		return ""
	}
}

func whenNot(name, def, want, what string) func(func(string) string) string {
	return func(getenv func(string) string) string {
		if v := orDefault(getenv, name, def); !strings.EqualFold(v, want) {
			return what + " (" + name + "=" + v + ")"
		}
		return ""
	}
}

var (
	statsOff = func(getenv func(string) string) string {
		if !peerBool(getenv, "USE_STATSD", "true") && !peerBool(getenv, "USE_DOG_STATSD", "false") {
			return "unused: the peer sends no statsd (USE_STATSD and USE_DOG_STATSD are false)"
		}
		return ""
	}
	anyStatsOff = func(getenv func(string) string) string {
		if statsOff(getenv) != "" && !peerBool(getenv, "USE_PROMETHEUS", "false") {
			return "unused: the peer exports no stats (USE_STATSD, USE_DOG_STATSD and USE_PROMETHEUS are false)"
		}
		return ""
	}
	promOff      = whenFalse("USE_PROMETHEUS", "false", "unused by the peer")
	perSecondOff = whenFalse("REDIS_PERSECOND", "false", "unused by the peer")
	tracingOff   = whenFalse("TRACING_ENABLED", "false", "unused by the peer")
	grpcTLSOff   = whenFalse("GRPC_SERVER_USE_TLS", "false", "unused by the peer")
	headersOff   = whenFalse("LIMIT_RESPONSE_HEADERS_ENABLED", "false", "unused by the peer")
	memcacheOff  = whenNot("BACKEND_TYPE", "redis", "memcache", "unused by the peer")
	xdsOff       = whenNot("CONFIG_TYPE", "FILE", "GRPC_XDS_SOTW", "unused by the peer")
	// The peer checks GRPC_CLIENT_TLS_SAN only in certificates it asks
	// for, which it does only with a client CA.
	clientCAOff = func(getenv func(string) string) string {
		if s := grpcTLSOff(getenv); s != "" {
			return s
		}
		if getenv("GRPC_CLIENT_TLS_CACERT") == "" {
			return "unused by the peer, which asks for no client certificate without GRPC_CLIENT_TLS_CACERT"
		}
		return ""
	}
	redisOff = func(getenv func(string) string) string {
		if v := orDefault(getenv, "BACKEND_TYPE", "redis"); !strings.EqualFold(v, "redis") {
			return "unused by the peer (BACKEND_TYPE=" + v + ")"
		}
		return ""
	}
	// The peer dials TCP to a Redis Cluster or Sentinel, whatever
	// REDIS_SOCKET_TYPE says: it reads it only for REDIS_TYPE=SINGLE.
	socketOff = func(getenv func(string) string) string {
		if s := redisOff(getenv); s != "" {
			return s
		}
		if t := orDefault(getenv, "REDIS_TYPE", "SINGLE"); !strings.EqualFold(t, "SINGLE") {
			return "unused by the peer, which dials TCP with REDIS_TYPE=" + t
		}
		return ""
	}
	redisTLSOff = func(getenv func(string) string) string {
		if s := redisOff(getenv); s != "" {
			return s
		}
		return whenFalse("REDIS_TLS", "false", "unused by the peer")(getenv)
	}
	iamOff = func(getenv func(string) string) string {
		if s := redisOff(getenv); s != "" {
			return s
		}
		return whenFalse("REDIS_AWS_IAM_AUTH", "false", "unused by the peer")(getenv)
	}
	fileOff = func(getenv func(string) string) string {
		if xdsOff(getenv) == "" {
			return "unused by the peer (CONFIG_TYPE=GRPC_XDS_SOTW)"
		}
		return ""
	}
	// With rule files the peer reads FORCE_START_WITHOUT_INITIAL_CONFIG and
	// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED too, but has its rules before
	// it serves; so does rls serve.
	fileRules = func(getenv func(string) string) string {
		if s := xdsOff(getenv); s != "" {
			return "rls serve loads its rule files before it serves, ready at once (CONFIG_TYPE=" + orDefault(getenv, "CONFIG_TYPE", "FILE") + ")"
		}
		return ""
	}
	dogStatsOff = whenFalse("USE_DOG_STATSD", "false", "unused by the peer")
	xdsTLSOff   = func(getenv func(string) string) string {
		if s := xdsOff(getenv); s != "" {
			return s
		}
		return whenFalse("CONFIG_GRPC_XDS_SERVER_USE_TLS", "false", "unused by the peer")(getenv)
	}
	udsSet = func(getenv func(string) string) string {
		if getenv("GRPC_UDS") != "" {
			return "unused by the peer (GRPC_UDS is set)"
		}
		return ""
	}
)

// Reasons shared by several variables.
const (
	whyNoPerSecond   = "sluice has no second Redis for per-second limits: one Redis, Sentinel or Redis Cluster holds every bucket (a token bucket is one key per limit, not one per window), and a per-second rule can carry a per-node local bucket that never calls Redis"
	whyNoMemcache    = "sluice has no memcache backend: a token bucket needs an atomic read-modify-write (a Lua script on Redis), which memcache's increments cannot do"
	whyPipelining    = "sluice has no pipelining settings: calls that arrive together share Redis round trips on their own (a batch per Redis node)"
	whyXDSBackoff    = "sluice's xDS client retries after --xds-backoff-min, doubling up to --xds-backoff-max"
	whyNoStartupWait = "sluice does not wait for Redis at start: it serves at once, answers from its fallback (--redis-failure) while Redis does not answer, and switches to Redis when a probe succeeds (docs/operations.md)"
)

// peerVars is every environment variable of envoyproxy/ratelimit's
// src/settings/settings.go, in its order.
var peerVars = []peerVar{
	// Listeners.
	{name: "HOST", def: "0.0.0.0", how: hMapped, flag: "http-addr"},
	{name: "PORT", def: "8080", kind: kNumber, how: hMapped, flag: "http-addr"},
	{name: "DEBUG_HOST", def: "0.0.0.0", how: hRefused, flag: "admin-addr", why: "the peer's debug listener (pprof, /rlconfig, /stats) has no equal: sluice serves /rlconfig on --http-addr, and pprof (with --pprof) and /json on --admin-addr, which should not be reachable from the network"},
	{name: "DEBUG_PORT", def: "6070", kind: kNumber, how: hRefused, flag: "admin-addr", why: "the peer's debug listener (pprof, /rlconfig, /stats) has no equal: sluice serves /rlconfig on --http-addr, and pprof (with --pprof) and /json on --admin-addr, which should not be reachable from the network"},
	{name: "GRPC_UDS", def: "", how: hMapped, flag: "grpc-addr"},
	{name: "GRPC_HOST", def: "0.0.0.0", how: hMapped, flag: "grpc-addr", inert: udsSet},
	{name: "GRPC_PORT", def: "8081", kind: kNumber, how: hMapped, flag: "grpc-addr", inert: udsSet},
	{name: "GRPC_MAX_CONNECTION_AGE", def: "24h", kind: kDuration, how: hMapped, flag: "grpc-max-conn-age"},
	{name: "GRPC_MAX_CONNECTION_AGE_GRACE", def: "1h", kind: kDuration, how: hMapped, flag: "grpc-max-conn-age-grace"},
	{name: "GRPC_SERVER_USE_TLS", def: "false", kind: kBool, how: hMapped, flag: "tls-cert", ok: []string{"false"}, why: "no TLS, as without --tls-cert"},
	{name: "GRPC_SERVER_TLS_CERT", def: "", how: hMapped, flag: "tls-cert", inert: grpcTLSOff},
	{name: "GRPC_SERVER_TLS_KEY", def: "", how: hMapped, flag: "tls-key", inert: grpcTLSOff},
	{name: "GRPC_CLIENT_TLS_CACERT", def: "", how: hMapped, flag: "tls-client-ca", inert: grpcTLSOff},
	{name: "GRPC_CLIENT_TLS_SAN", def: "", how: hMapped, flag: "tls-client-san", inert: clientCAOff},
	{name: "LOG_LEVEL", def: "WARN", kind: kWord, how: hMapped, flag: "log-level"},
	{name: "LOG_FORMAT", def: "text", kind: kWord, how: hMapped, flag: "log-format"},

	// Where the rules come from.
	{name: "CONFIG_TYPE", def: "FILE", kind: kWord, how: hMapped, flag: "xds-server", ok: []string{"FILE"}},
	{name: "FORCE_START_WITHOUT_INITIAL_CONFIG", def: "false", kind: kBool, how: hMapped, flag: "xds-ready-before-rules", inert: fileRules},
	{name: "CONFIG_GRPC_XDS_NODE_ID", def: "default", how: hMapped, flag: "xds-node-id", inert: xdsOff},
	{name: "CONFIG_GRPC_XDS_NODE_METADATA", def: "", how: hRefused, inert: xdsOff, why: "sluice's xDS client sends no node metadata (--xds-node-id and --xds-node-cluster name the node)"},
	{name: "CONFIG_GRPC_XDS_SERVER_URL", def: "localhost:18000", how: hMapped, flag: "xds-server", inert: xdsOff},
	{name: "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", def: "3s", kind: kDuration, how: hAccepted, flag: "xds-backoff-min", ok: []string{"3s"}, inert: xdsOff, why: whyXDSBackoff},
	{name: "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", def: "", how: hRefused, inert: xdsOff, secret: true, why: "sluice's xDS client sends no extra headers"},
	{name: "CONFIG_GRPC_XDS_SERVER_USE_TLS", def: "false", kind: kBool, how: hMapped, flag: "xds-tls-ca", ok: []string{"false"}, inert: xdsOff, why: "no TLS to the xDS server, as without --xds-tls-ca"},
	{name: "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", def: "", how: hMapped, flag: "xds-tls-cert", inert: xdsTLSOff},
	{name: "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", def: "", how: hMapped, flag: "xds-tls-key", inert: xdsTLSOff},
	{name: "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", def: "", how: hMapped, flag: "xds-tls-ca", inert: xdsTLSOff},
	{name: "CONFIG_GRPC_XDS_SERVER_TLS_SAN", def: "", how: hMapped, flag: "xds-tls-server-name", inert: xdsTLSOff},
	{name: "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", def: "10s", kind: kDuration, how: hMapped, flag: "xds-backoff-min", inert: xdsOff},
	{name: "XDS_CLIENT_BACKOFF_MAX_INTERVAL", def: "60s", kind: kDuration, how: hMapped, flag: "xds-backoff-max", inert: xdsOff},
	{name: "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", def: "0.5", kind: kNumber, how: hAccepted, ok: []string{"0.5"}, inert: xdsOff, why: "sluice jitters each wait to half to all of it, as this factor 0.5"},
	{name: "XDS_CLIENT_BACKOFF_JITTER", def: "true", kind: kBool, how: hAccepted, ok: []string{"true"}, inert: xdsOff, why: "sluice jitters each wait to half to all of it"},
	{name: "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", def: "", kind: kNumber, how: hMapped, flag: "max-rule-bytes", inert: xdsOff},

	// Stats.
	{name: "USE_DOG_STATSD", def: "false", kind: kBool, how: hAccepted, ok: []string{"false"}, why: "sluice sends plain statsd (USE_STATSD, --statsd-addr), not DogStatsD's tags"},
	{name: "USE_DOG_STATSD_MOGRIFIERS", def: "", how: hRefused, inert: dogStatsOff, why: "sluice sends plain statsd (USE_STATSD, --statsd-addr), not DogStatsD's tags"},
	{name: "USE_STATSD", def: "true", kind: kBool, how: hMapped, flag: "statsd-addr", ok: []string{"false"}, why: "sluice sends no statsd either"},
	{name: "STATSD_HOST", def: "localhost", how: hMapped, flag: "statsd-addr", inert: statsOff},
	{name: "STATSD_PORT", def: "8125", kind: kNumber, how: hMapped, flag: "statsd-addr", inert: statsOff},
	{name: "EXTRA_TAGS", def: "", how: hRefused, inert: anyStatsOff, why: "sluice adds no constant labels or tags to its metrics: add them when scraping (Prometheus relabel_configs or the ServiceMonitor's) or in the statsd server"},
	{name: "STATS_FLUSH_INTERVAL", def: "10s", kind: kDuration, how: hMapped, flag: "statsd-interval", inert: statsOff},
	{name: "DISABLE_STATS", def: "false", kind: kBool, how: hAccepted, ok: []string{"false", "true"}, why: "sluice always serves its Prometheus metrics at /metrics on --http-addr; with true it sends no statsd, as the peer"},
	{name: "USE_PROMETHEUS", def: "false", kind: kBool, how: hMapped, flag: "metrics-addr", ok: []string{"false"}, why: "sluice serves its Prometheus metrics at /metrics on --http-addr (default :8080) in any case"},
	{name: "PROMETHEUS_ADDR", def: ":9090", how: hMapped, flag: "metrics-addr", inert: promOff},
	{name: "PROMETHEUS_PATH", def: "/metrics", how: hMapped, flag: "metrics-path", inert: promOff},
	{name: "PROMETHEUS_MAPPER_YAML", def: "", how: hAccepted, anyOK: true, warn: true, inert: promOff, why: "sluice reads no statsd mapper: its metrics are native Prometheus series, named as docs/metrics.md says, at /metrics on --http-addr and --metrics-addr (docs/envoy-gateway.md maps the peer's names); for the peer's names, send statsd (--statsd-addr) to a statsd_exporter with this mapping"},

	// Rule files.
	{name: "RUNTIME_ROOT", def: "/srv/runtime_data/current", how: hMapped, flag: "config", inert: fileOff},
	{name: "RUNTIME_SUBDIRECTORY", def: "", how: hMapped, flag: "config", inert: fileOff},
	{name: "RUNTIME_APPDIRECTORY", def: "config", how: hMapped, flag: "config", inert: fileOff},
	{name: "RUNTIME_IGNOREDOTFILES", def: "false", kind: kBool, how: hAccepted, ok: []string{"true", "false"}, why: "sluice always skips files whose names start with a dot"},
	{name: "RUNTIME_WATCH_ROOT", def: "true", kind: kBool, how: hAccepted, ok: []string{"true", "false"}, why: "sluice watches both the --config directory and every symlink on the way to it, so both ways of reloading work"},

	// Counting.
	{name: "EXPIRATION_JITTER_MAX_SECONDS", def: "300", kind: kNumber, how: hAccepted, ok: []string{"300"}, why: "sluice sets no jitter: a bucket's key expires when the bucket would be full again"},
	{name: "LOCAL_CACHE_SIZE_IN_BYTES", def: "0", kind: kNumber, how: hAccepted, anyOK: true, why: "sluice always remembers buckets Redis reported empty until their next token is due (at most 65536 per node), whatever this size"},
	{name: "NEAR_LIMIT_RATIO", def: "0.8", kind: kNumber, how: hAccepted, ok: []string{"0.8"}, why: "sluice's near_limit is fixed: allowed with less than 20% of the burst left"},
	{name: "CACHE_KEY_PREFIX", def: "", how: hAccepted, ok: []string{""}, why: "sluice's keys are sluice:{<hash>}; separate deployments by Redis database (/db in --redis) or by Redis"},
	{name: "BACKEND_TYPE", def: "redis", kind: kWord, how: hAccepted, ok: []string{"redis"}, why: whyNoMemcache},
	{name: "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", def: "false", kind: kBool, how: hAccepted, ok: []string{"false", "true"}, why: "whatever the value, a refused request takes nothing from sluice's buckets, except on postpaid and quota_mode rules, which charge what does not fit, into at most one burst of debt (docs/config.md)"},

	// Responses.
	{name: "LIMIT_RESPONSE_HEADERS_ENABLED", def: "false", kind: kBool, how: hMapped, flag: "ratelimit-headers"},
	{name: "LIMIT_LIMIT_HEADER", def: "RateLimit-Limit", how: hMapped, flag: "ratelimit-header-limit", ok: []string{"RateLimit-Limit"}, inert: headersOff},
	{name: "LIMIT_REMAINING_HEADER", def: "RateLimit-Remaining", how: hMapped, flag: "ratelimit-header-remaining", ok: []string{"RateLimit-Remaining"}, inert: headersOff},
	{name: "LIMIT_RESET_HEADER", def: "RateLimit-Reset", how: hMapped, flag: "ratelimit-header-reset", ok: []string{"RateLimit-Reset"}, inert: headersOff},

	// Health.
	{name: "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", def: "false", kind: kBool, how: hMapped, flag: "xds-ready-before-rules", inert: fileRules},

	// Redis.
	{name: "REDIS_SOCKET_TYPE", def: "unix", kind: kWord, how: hMapped, flag: "redis", inert: socketOff},
	{name: "REDIS_TYPE", def: "SINGLE", kind: kWord, how: hMapped, flag: "redis", inert: redisOff},
	{name: "REDIS_URL", def: "/var/run/nutcracker/ratelimit.sock", how: hMapped, flag: "redis", inert: redisOff, secret: true},
	{name: "REDIS_POOL_SIZE", def: "10", kind: kNumber, how: hMapped, flag: "redis", inert: redisOff},
	{name: "REDIS_AUTH", def: "", how: hMapped, flag: "redis", inert: redisOff, secret: true},
	{name: "REDIS_TLS", def: "false", kind: kBool, how: hMapped, flag: "redis", inert: redisOff},
	{name: "REDIS_TLS_CLIENT_CERT", def: "", how: hMapped, flag: "redis-tls-cert", inert: redisTLSOff},
	{name: "REDIS_TLS_CLIENT_KEY", def: "", how: hMapped, flag: "redis-tls-key", inert: redisTLSOff},
	{name: "REDIS_TLS_CACERT", def: "", how: hMapped, flag: "redis-ca", inert: redisTLSOff},
	{name: "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", def: "false", kind: kBool, how: hAccepted, ok: []string{"false"}, inert: redisTLSOff, why: "sluice checks Redis' certificate and its host name; rediss://…?skip_verify=true in --redis skips every check, not only the name: give Redis a certificate that names the host instead"},
	{name: "REDIS_PIPELINE_WINDOW", def: "0", kind: kDuration, how: hAccepted, ok: []string{"0"}, inert: redisOff, why: whyPipelining},
	{name: "REDIS_PIPELINE_LIMIT", def: "0", kind: kNumber, how: hAccepted, ok: []string{"0"}, inert: redisOff, why: whyPipelining},
	{name: "REDIS_USE_EXPLICIT_PIPELINE", def: "false", kind: kBool, how: hAccepted, ok: []string{"false"}, inert: redisOff, why: whyPipelining},
	{name: "REDIS_PERSECOND", def: "false", kind: kBool, how: hAccepted, ok: []string{"false"}, why: whyNoPerSecond},
	{name: "REDIS_PERSECOND_SOCKET_TYPE", def: "unix", kind: kWord, how: hRefused, inert: perSecondOff, why: whyNoPerSecond},
	{name: "REDIS_PERSECOND_TYPE", def: "SINGLE", kind: kWord, how: hRefused, inert: perSecondOff, why: whyNoPerSecond},
	{name: "REDIS_PERSECOND_URL", def: "/var/run/nutcracker/ratelimitpersecond.sock", how: hRefused, inert: perSecondOff, secret: true, why: whyNoPerSecond},
	{name: "REDIS_PERSECOND_POOL_SIZE", def: "10", kind: kNumber, how: hRefused, inert: perSecondOff, why: whyNoPerSecond},
	{name: "REDIS_PERSECOND_AUTH", def: "", how: hRefused, inert: perSecondOff, secret: true, why: whyNoPerSecond},
	{name: "REDIS_PERSECOND_TLS", def: "false", kind: kBool, how: hRefused, inert: perSecondOff, why: whyNoPerSecond},
	{name: "REDIS_SENTINEL_AUTH", def: "", how: hMapped, flag: "redis", inert: redisOff, secret: true},
	{name: "REDIS_PERSECOND_SENTINEL_AUTH", def: "", how: hRefused, inert: perSecondOff, secret: true, why: whyNoPerSecond},
	{name: "REDIS_PERSECOND_PIPELINE_WINDOW", def: "0", kind: kDuration, how: hRefused, inert: perSecondOff, why: whyNoPerSecond},
	{name: "REDIS_PERSECOND_PIPELINE_LIMIT", def: "0", kind: kNumber, how: hRefused, inert: perSecondOff, why: whyNoPerSecond},
	{name: "REDIS_PERSECOND_USE_EXPLICIT_PIPELINE", def: "false", kind: kBool, how: hRefused, inert: perSecondOff, why: whyNoPerSecond},
	{name: "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", def: "false", kind: kBool, how: hAccepted, ok: []string{"false"}, inert: redisOff, why: "sluice's health never depends on Redis: while Redis fails it answers from its fallback (--redis-failure)"},
	{name: "REDIS_TIMEOUT", def: "10s", kind: kDuration, how: hRefused, flag: "redis-timeout", inert: redisOff, why: "not the same timeout: sluice's --redis-timeout (default 10ms) bounds every Redis call, after which the node answers from its fallback; the peer's bounds connections and I/O and then fails the request"},
	{name: "REDIS_PERSECOND_TIMEOUT", def: "10s", kind: kDuration, how: hRefused, inert: perSecondOff, why: whyNoPerSecond},
	{name: "REDIS_POOL_ON_EMPTY_BEHAVIOR", def: "WAIT", kind: kWord, how: hAccepted, ok: []string{"WAIT"}, inert: redisOff, why: "sluice waits for a pooled connection too, at most --redis-timeout"},
	{name: "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", def: "WAIT", kind: kWord, how: hRefused, inert: perSecondOff, why: whyNoPerSecond},
	{name: "REDIS_STARTUP_INITIAL_INTERVAL", def: "1s", kind: kDuration, how: hAccepted, anyOK: true, inert: redisOff, why: whyNoStartupWait},
	{name: "REDIS_STARTUP_MAX_INTERVAL", def: "30s", kind: kDuration, how: hAccepted, anyOK: true, inert: redisOff, why: whyNoStartupWait},
	{name: "REDIS_STARTUP_MAX_ELAPSED_TIME", def: "0", kind: kDuration, how: hAccepted, anyOK: true, inert: redisOff, why: whyNoStartupWait},

	// Memcache.
	{name: "MEMCACHE_HOST_PORT", def: "", how: hRefused, inert: memcacheOff, why: whyNoMemcache},
	{name: "MEMCACHE_MAX_IDLE_CONNS", def: "2", kind: kNumber, how: hRefused, inert: memcacheOff, why: whyNoMemcache},
	{name: "MEMCACHE_SRV", def: "", how: hRefused, inert: memcacheOff, why: whyNoMemcache},
	{name: "MEMCACHE_SRV_REFRESH", def: "0", kind: kDuration, how: hRefused, inert: memcacheOff, why: whyNoMemcache},
	{name: "MEMCACHE_TLS", def: "false", kind: kBool, how: hRefused, inert: memcacheOff, why: whyNoMemcache},
	{name: "MEMCACHE_TLS_CLIENT_CERT", def: "", how: hRefused, inert: memcacheOff, why: whyNoMemcache},
	{name: "MEMCACHE_TLS_CLIENT_KEY", def: "", how: hRefused, inert: memcacheOff, why: whyNoMemcache},
	{name: "MEMCACHE_TLS_CACERT", def: "", how: hRefused, inert: memcacheOff, why: whyNoMemcache},
	{name: "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", def: "false", kind: kBool, how: hRefused, inert: memcacheOff, why: whyNoMemcache},

	// Service behaviour.
	{name: "SHADOW_MODE", def: "false", kind: kBool, how: hMapped, flag: "shadow"},
	{name: "QUOTA_MODE", def: "false", kind: kBool, how: hMapped, flag: "quota-mode"},
	{name: "RESPONSE_DYNAMIC_METADATA", def: "false", kind: kBool, how: hMapped, flag: "response-metadata", ok: []string{"false"}},
	{name: "MERGE_DOMAIN_CONFIG", def: "false", kind: kBool, how: hMapped, flag: "merge-domains"},

	// Tracing.
	{name: "TRACING_ENABLED", def: "false", kind: kBool, how: hMapped, flag: "tracing-protocol", ok: []string{"false"}, why: "sluice traces nothing either: OTEL_EXPORTER_OTLP_ENDPOINT is not read while it is false (--tracing-endpoint still traces)"},
	{name: "TRACING_SERVICE_NAME", def: "RateLimit", how: hMapped, flag: "tracing-resource", inert: tracingOff},
	{name: "TRACING_SERVICE_NAMESPACE", def: "", how: hMapped, flag: "tracing-resource", inert: tracingOff},
	{name: "TRACING_SERVICE_INSTANCE_ID", def: "", how: hMapped, flag: "tracing-resource", inert: tracingOff},
	{name: "TRACING_EXPORTER_PROTOCOL", def: "http", kind: kWord, how: hMapped, flag: "tracing-protocol", inert: tracingOff},
	{name: "TRACING_SAMPLING_RATE", def: "1", kind: kNumber, how: hMapped, flag: "tracing-sample-ratio", inert: tracingOff},

	// Settings of later peer versions than the settings.go copied into
	// testdata, seen in their tests and src/redis/credentials*.go.
	{name: "GRPC_MAX_CONCURRENT_STREAMS", def: "0", kind: kNumber, how: hAccepted, ok: []string{"0"}, why: "sluice has no stream cap; --grpc-max-conn-idle, --grpc-max-conn-age and --http-max-conns bound connections"},
	{name: "MAX_CONCURRENT_REQUESTS", def: "0", kind: kNumber, how: hAccepted, ok: []string{"0"}, why: "sluice has no request admission limit"},
	{name: "REQUEST_TIMEOUT", def: "0", kind: kDuration, how: hAccepted, ok: []string{"0"}, why: "sluice bounds each Redis call with --redis-timeout and answers from its fallback after it"},
	{name: "REDIS_CLUSTER_PIPELINE_PARALLELISM", def: "1", kind: kNumber, how: hAccepted, ok: []string{"1"}, inert: redisOff, why: whyPipelining},
	{name: "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", def: "1", kind: kNumber, how: hRefused, inert: perSecondOff, why: whyNoPerSecond},
	{name: "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", def: "false", kind: kBool, how: hRefused, inert: promOff, why: "sluice's durations are in seconds, as Prometheus names them (ratelimit_request_duration_seconds)"},
	{name: "REDIS_AUTH_FILE", def: "", how: hRefused, flag: "redis", inert: redisOff, why: "sluice reads no password file: put the password into --redis (RLS_REDIS from a Secret)"},
	{name: "REDIS_PERSECOND_AUTH_FILE", def: "", how: hRefused, inert: perSecondOff, why: whyNoPerSecond},
	{name: "REDIS_AWS_IAM_AUTH", def: "false", kind: kBool, how: hAccepted, ok: []string{"false"}, inert: redisOff, why: "sluice has no ElastiCache IAM authentication: give --redis a user and password"},
	{name: "REDIS_AWS_IAM_CACHE_NAME", def: "", how: hRefused, inert: iamOff, why: "sluice has no ElastiCache IAM authentication"},
	{name: "REDIS_AWS_IAM_USER_ID", def: "", how: hRefused, inert: iamOff, why: "sluice has no ElastiCache IAM authentication"},
	{name: "REDIS_AWS_IAM_REGION", def: "", how: hRefused, inert: iamOff, why: "sluice has no ElastiCache IAM authentication"},
	{name: "REDIS_AWS_IAM_SERVERLESS", def: "false", kind: kBool, how: hRefused, inert: iamOff, why: "sluice has no ElastiCache IAM authentication"},
	{name: "REDIS_PERSECOND_AWS_IAM_AUTH", def: "false", kind: kBool, how: hRefused, inert: perSecondOff, why: whyNoPerSecond},
	{name: "REDIS_PERSECOND_AWS_IAM_CACHE_NAME", def: "", how: hRefused, inert: perSecondOff, why: whyNoPerSecond},
	{name: "REDIS_PERSECOND_AWS_IAM_USER_ID", def: "", how: hRefused, inert: perSecondOff, why: whyNoPerSecond},
	{name: "REDIS_PERSECOND_AWS_IAM_SERVERLESS", def: "false", kind: kBool, how: hRefused, inert: perSecondOff, why: whyNoPerSecond},
	{name: "SANITIZE_DESCRIPTOR_METRIC_DOTS", def: "false", kind: kBool, how: hRefused, inert: anyStatsOff, why: "sluice's rule label keeps the rule path as it is; no stat name needs sanitizing"},
}

// strayVars are variables that deployments of the peer set but the peer
// does not read: rls serve does not read them either, and says so.
var strayVars = map[string]string{
	// Envoy Gateway sets it beside GRPC_SERVER_TLS_CERT.
	"GRPC_SERVER_TLS_CA_CERT": "the peer reads no GRPC_SERVER_TLS_CA_CERT (its client CA is GRPC_CLIENT_TLS_CACERT): no client certificate is asked for, as by the peer",
}

// peerMap converts the variables vars into the value of one sluice flag.
// convert returns "" when nothing is to be set.
type peerMap struct {
	flag    string
	vars    []string
	convert func(getenv func(string) string) (string, error)
}

// peerMaps are the conversions of the mapped variables: each hMapped
// variable is in exactly one (peerenv_test checks it).
var peerMaps = []peerMap{
	{flag: "http-addr", vars: []string{"HOST", "PORT"}, convert: hostPort("HOST", "0.0.0.0", "PORT", "8080")},
	{flag: "grpc-addr", vars: []string{"GRPC_UDS"}, convert: func(getenv func(string) string) (string, error) {
		return "unix:" + getenv("GRPC_UDS"), nil
	}},
	{flag: "grpc-addr", vars: []string{"GRPC_HOST", "GRPC_PORT"}, convert: hostPort("GRPC_HOST", "0.0.0.0", "GRPC_PORT", "8081")},
	{flag: "grpc-max-conn-age", vars: []string{"GRPC_MAX_CONNECTION_AGE"}, convert: same("GRPC_MAX_CONNECTION_AGE")},
	{flag: "grpc-max-conn-age-grace", vars: []string{"GRPC_MAX_CONNECTION_AGE_GRACE"}, convert: same("GRPC_MAX_CONNECTION_AGE_GRACE")},
	{flag: "tls-cert", vars: []string{"GRPC_SERVER_USE_TLS", "GRPC_SERVER_TLS_CERT"}, convert: grpcTLSCert},
	{flag: "tls-key", vars: []string{"GRPC_SERVER_TLS_KEY"}, convert: same("GRPC_SERVER_TLS_KEY")},
	{flag: "tls-client-ca", vars: []string{"GRPC_CLIENT_TLS_CACERT"}, convert: same("GRPC_CLIENT_TLS_CACERT")},
	{flag: "tls-client-san", vars: []string{"GRPC_CLIENT_TLS_SAN"}, convert: clientSAN},
	{flag: "log-level", vars: []string{"LOG_LEVEL"}, convert: logLevel},
	{flag: "log-format", vars: []string{"LOG_FORMAT"}, convert: logFormat},
	{flag: "xds-server", vars: []string{"CONFIG_TYPE", "CONFIG_GRPC_XDS_SERVER_URL"}, convert: xdsServer},
	{flag: "xds-node-id", vars: []string{"CONFIG_GRPC_XDS_NODE_ID"}, convert: same("CONFIG_GRPC_XDS_NODE_ID")},
	{flag: "xds-tls-cert", vars: []string{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT"}, convert: same("CONFIG_GRPC_XDS_CLIENT_TLS_CERT")},
	{flag: "xds-tls-key", vars: []string{"CONFIG_GRPC_XDS_CLIENT_TLS_KEY"}, convert: same("CONFIG_GRPC_XDS_CLIENT_TLS_KEY")},
	{flag: "xds-tls-ca", vars: []string{"CONFIG_GRPC_XDS_SERVER_USE_TLS", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT"}, convert: xdsTLSCA},
	{flag: "max-rule-bytes", vars: []string{"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"}, convert: same("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES")},
	{flag: "xds-backoff-min", vars: []string{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL"}, convert: same("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL")},
	{flag: "xds-backoff-max", vars: []string{"XDS_CLIENT_BACKOFF_MAX_INTERVAL"}, convert: same("XDS_CLIENT_BACKOFF_MAX_INTERVAL")},
	{flag: "xds-tls-server-name", vars: []string{"CONFIG_GRPC_XDS_SERVER_TLS_SAN"}, convert: same("CONFIG_GRPC_XDS_SERVER_TLS_SAN")},
	{flag: "config", vars: []string{"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY"}, convert: runtimePath},
	{flag: "ratelimit-headers", vars: []string{"LIMIT_RESPONSE_HEADERS_ENABLED"}, convert: boolean("LIMIT_RESPONSE_HEADERS_ENABLED")},
	{flag: "ratelimit-header-limit", vars: []string{"LIMIT_LIMIT_HEADER"}, convert: same("LIMIT_LIMIT_HEADER")},
	{flag: "ratelimit-header-remaining", vars: []string{"LIMIT_REMAINING_HEADER"}, convert: same("LIMIT_REMAINING_HEADER")},
	{flag: "ratelimit-header-reset", vars: []string{"LIMIT_RESET_HEADER"}, convert: same("LIMIT_RESET_HEADER")},
	{flag: "redis", vars: []string{"REDIS_SOCKET_TYPE", "REDIS_TYPE", "REDIS_URL", "REDIS_POOL_SIZE", "REDIS_AUTH", "REDIS_TLS", "REDIS_SENTINEL_AUTH"}, convert: redisURL},
	{flag: "redis-tls-cert", vars: []string{"REDIS_TLS_CLIENT_CERT"}, convert: same("REDIS_TLS_CLIENT_CERT")},
	{flag: "redis-tls-key", vars: []string{"REDIS_TLS_CLIENT_KEY"}, convert: same("REDIS_TLS_CLIENT_KEY")},
	{flag: "redis-ca", vars: []string{"REDIS_TLS_CACERT"}, convert: same("REDIS_TLS_CACERT")},
	{flag: "shadow", vars: []string{"SHADOW_MODE"}, convert: boolean("SHADOW_MODE")},
	{flag: "quota-mode", vars: []string{"QUOTA_MODE"}, convert: boolean("QUOTA_MODE")},
	{flag: "response-metadata", vars: []string{"RESPONSE_DYNAMIC_METADATA"}, convert: boolean("RESPONSE_DYNAMIC_METADATA")},
	{flag: "merge-domains", vars: []string{"MERGE_DOMAIN_CONFIG"}, convert: boolean("MERGE_DOMAIN_CONFIG")},
	{flag: "tracing-sample-ratio", vars: []string{"TRACING_SAMPLING_RATE"}, convert: same("TRACING_SAMPLING_RATE")},
	{flag: "tracing-protocol", vars: []string{"TRACING_ENABLED", "TRACING_EXPORTER_PROTOCOL"}, convert: tracingProtocol},
	{flag: "tracing-resource", vars: []string{"TRACING_SERVICE_NAME", "TRACING_SERVICE_NAMESPACE", "TRACING_SERVICE_INSTANCE_ID"}, convert: tracingResource},
	{flag: "xds-ready-before-rules", vars: []string{"FORCE_START_WITHOUT_INITIAL_CONFIG", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED"}, convert: readyBeforeRules},
	{flag: "statsd-addr", vars: []string{"USE_STATSD", "STATSD_HOST", "STATSD_PORT"}, convert: statsdAddr},
	{flag: "statsd-interval", vars: []string{"STATS_FLUSH_INTERVAL"}, convert: same("STATS_FLUSH_INTERVAL")},
	{flag: "metrics-addr", vars: []string{"USE_PROMETHEUS", "PROMETHEUS_ADDR"}, convert: metricsAddr},
	{flag: "metrics-path", vars: []string{"PROMETHEUS_PATH"}, convert: same("PROMETHEUS_PATH")},
}

func same(name string) func(func(string) string) (string, error) {
	return func(getenv func(string) string) (string, error) { return getenv(name), nil }
}

func boolean(name string) func(func(string) string) (string, error) {
	return func(getenv func(string) string) (string, error) {
		return strconv.FormatBool(peerBool(getenv, name, "false")), nil
	}
}

func hostPort(host, defHost, port, defPort string) func(func(string) string) (string, error) {
	return func(getenv func(string) string) (string, error) {
		return net.JoinHostPort(orDefault(getenv, host, defHost), orDefault(getenv, port, defPort)), nil
	}
}

// logLevel converts a logrus level (the peer's) to a --log-level.
func logLevel(getenv func(string) string) (string, error) {
	v := getenv("LOG_LEVEL")
	switch strings.ToLower(v) {
	case "trace", "debug":
		return "debug", nil
	case "info":
		return "info", nil
	case "warn", "warning":
		return "warn", nil
	case "error", "fatal", "panic":
		return "error", nil
	}
	return "", fmt.Errorf("LOG_LEVEL=%q is not a level (trace, debug, info, warn, error, fatal or panic)", v)
}

// logFormat converts LOG_FORMAT: the peer logs JSON for "json" and text
// for anything else.
func logFormat(getenv func(string) string) (string, error) {
	if strings.EqualFold(getenv("LOG_FORMAT"), "json") {
		return "json", nil
	}
	return "text", nil
}

// grpcTLSCert is --tls-cert from GRPC_SERVER_USE_TLS and
// GRPC_SERVER_TLS_CERT: the peer serves TLS only with the first true, and
// then cannot do without the second.
func grpcTLSCert(getenv func(string) string) (string, error) {
	if !peerBool(getenv, "GRPC_SERVER_USE_TLS", "false") {
		return "", nil
	}
	if getenv("GRPC_SERVER_TLS_CERT") == "" {
		return "", fmt.Errorf("GRPC_SERVER_USE_TLS=true without GRPC_SERVER_TLS_CERT: give --tls-cert and --tls-key")
	}
	return getenv("GRPC_SERVER_TLS_CERT"), nil
}

// clientSAN is --tls-client-san from GRPC_CLIENT_TLS_SAN, which the peer
// checks as one host name (or IP address) with x509's rules. A value
// --tls-client-san would read otherwise, as a list (a comma) or a URI SAN
// ("://"), is refused: the peer accepted no client with it.
func clientSAN(getenv func(string) string) (string, error) {
	v := getenv("GRPC_CLIENT_TLS_SAN")
	if strings.Contains(v, ",") || strings.Contains(v, "://") {
		return "", fmt.Errorf("GRPC_CLIENT_TLS_SAN=%q: the peer checks it as one host name, which no client certificate matches; --tls-client-san would read a list or a URI SAN: give --tls-client-san yourself", v)
	}
	return v, nil
}

// xdsServer is --xds-server for CONFIG_TYPE=GRPC_XDS_SOTW.
func xdsServer(getenv func(string) string) (string, error) {
	if xdsOff(getenv) != "" {
		return "", nil
	}
	return orDefault(getenv, "CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000"), nil
}

// xdsTLSCA is --xds-tls-ca from CONFIG_GRPC_XDS_SERVER_USE_TLS and
// CONFIG_GRPC_XDS_SERVER_TLS_CACERT: sluice's xDS client uses TLS only with
// a CA bundle, where the peer could verify with the system roots.
func xdsTLSCA(getenv func(string) string) (string, error) {
	if !peerBool(getenv, "CONFIG_GRPC_XDS_SERVER_USE_TLS", "false") {
		return "", nil
	}
	if getenv("CONFIG_GRPC_XDS_SERVER_TLS_CACERT") == "" {
		return "", fmt.Errorf("CONFIG_GRPC_XDS_SERVER_USE_TLS=true without CONFIG_GRPC_XDS_SERVER_TLS_CACERT: sluice's xDS client uses TLS only with a CA bundle; give --xds-tls-ca")
	}
	return getenv("CONFIG_GRPC_XDS_SERVER_TLS_CACERT"), nil
}

// readyBeforeRules is --xds-ready-before-rules: the peer with
// FORCE_START_WITHOUT_INITIAL_CONFIG=true serves before its first xDS
// update, and its health check waits for rules only with
// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED=true. (Without the first, it
// does not serve until the first update: not ready, as rls serve by
// default.)
func readyBeforeRules(getenv func(string) string) (string, error) {
	if xdsOff(getenv) != "" {
		return "", nil
	}
	ready := peerBool(getenv, "FORCE_START_WITHOUT_INITIAL_CONFIG", "false") &&
		!peerBool(getenv, "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "false")
	return strconv.FormatBool(ready), nil
}

// statsdAddr is --statsd-addr: STATSD_HOST:STATSD_PORT while the peer
// sends statsd (USE_STATSD, true by default, and not DISABLE_STATS).
func statsdAddr(getenv func(string) string) (string, error) {
	if !peerBool(getenv, "USE_STATSD", "true") || peerBool(getenv, "DISABLE_STATS", "false") {
		return "", nil
	}
	port := orDefault(getenv, "STATSD_PORT", "8125")
	if isServiceLink(kNumber, port) {
		port = "8125" // a Service's link variable, not the peer's setting
	}
	return net.JoinHostPort(orDefault(getenv, "STATSD_HOST", "localhost"), port), nil
}

// runtimePath is --config: the peer loads
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY/*.yaml.
func runtimePath(getenv func(string) string) (string, error) {
	return filepath.Join(orDefault(getenv, "RUNTIME_ROOT", "/srv/runtime_data/current"),
		getenv("RUNTIME_SUBDIRECTORY"), orDefault(getenv, "RUNTIME_APPDIRECTORY", "config")), nil
}

// redisURL is --redis from the peer's REDIS_* variables: REDIS_URL is
// host:port (SINGLE), master,host:port,... (SENTINEL) or host:port,...
// (CLUSTER), or a socket path with REDIS_SOCKET_TYPE=unix (read, as by the
// peer, only for SINGLE); REDIS_AUTH is
// password or user:password; REDIS_TLS picks rediss:// (sentinels://).
func redisURL(getenv func(string) string) (string, error) {
	typ := strings.ToUpper(orDefault(getenv, "REDIS_TYPE", "SINGLE"))
	addr := orDefault(getenv, "REDIS_URL", "/var/run/nutcracker/ratelimit.sock")
	socket := "tcp" // the peer dials TCP to a Cluster or Sentinel
	if typ == "SINGLE" {
		def := "unix"
		if strings.Contains(addr, "://") {
			def = "tcp" // redis://host:port is no socket path, whatever the default
		}
		socket = orDefault(getenv, "REDIS_SOCKET_TYPE", def)
	}
	tls := peerBool(getenv, "REDIS_TLS", "false")
	userinfo := ""
	if auth := getenv("REDIS_AUTH"); auth != "" {
		user, pass, ok := strings.Cut(auth, ":")
		if !ok {
			user, pass = "", auth
		}
		userinfo = escapeAll(user) + ":" + escapeAll(pass) + "@"
	}
	var query []string
	if getenv("REDIS_POOL_SIZE") != "" && typ != "SENTINEL" {
		query = append(query, "pool_size="+getenv("REDIS_POOL_SIZE"))
	}
	if getenv("REDIS_POOL_SIZE") != "" && typ == "SENTINEL" && !sameValue(kNumber, getenv("REDIS_POOL_SIZE"), "10") {
		return "", fmt.Errorf("REDIS_POOL_SIZE=%s with REDIS_TYPE=SENTINEL: sentinel:// URLs in --redis take no pool size; unset it", getenv("REDIS_POOL_SIZE"))
	}
	if sa := getenv("REDIS_SENTINEL_AUTH"); sa != "" {
		if typ != "SENTINEL" {
			return "", fmt.Errorf("REDIS_SENTINEL_AUTH is set but REDIS_TYPE=%s: unset it", typ)
		}
		query = append(query, "sentinel_password="+escapeAll(sa))
	}
	q := ""
	if len(query) > 0 {
		q = "?" + strings.Join(query, "&")
	}
	if strings.EqualFold(socket, "unix") {
		if tls {
			return "", fmt.Errorf("REDIS_TLS=true with REDIS_SOCKET_TYPE=unix: unix:// in --redis speaks plain Redis, without TLS")
		}
		// REDIS_URL is secret (it may hold a password): not repeated here.
		if !strings.HasPrefix(addr, "/") {
			return "", fmt.Errorf("REDIS_SOCKET_TYPE=unix: REDIS_URL must be the socket's absolute path (/path/redis.sock) for unix:// in --redis")
		}
		// The path is escaped (a '?', '#' or '%' in it stays in the path);
		// go-redis unescapes it.
		return "unix://" + userinfo + (&url.URL{Path: addr}).EscapedPath() + q, nil
	}
	if !strings.EqualFold(socket, "tcp") {
		return "", fmt.Errorf("REDIS_SOCKET_TYPE=%q: want tcp or unix", socket)
	}
	scheme := "redis://"
	if tls {
		scheme = "rediss://"
	}
	switch typ {
	case "SINGLE", "CLUSTER":
		if strings.Contains(addr, "://") {
			if userinfo != "" || tls || q != "" {
				return "", fmt.Errorf("REDIS_URL is a URL: put REDIS_AUTH, REDIS_TLS and REDIS_POOL_SIZE into --redis yourself")
			}
			return addr, nil
		}
		nodes := strings.Split(addr, ",")
		if typ == "SINGLE" && len(nodes) > 1 {
			return "", fmt.Errorf("REDIS_TYPE=SINGLE with a list in REDIS_URL: one host:port, or REDIS_TYPE=CLUSTER")
		}
		// The first node carries scheme, credentials and parameters; in a
		// list they apply to every node (backend/redis.ParseURL).
		nodes[0] = scheme + userinfo + strings.TrimSpace(nodes[0]) + q
		if typ == "CLUSTER" && len(nodes) == 1 {
			sep := "?"
			if q != "" {
				sep = "&"
			}
			nodes[0] += sep + "cluster=true"
		}
		return strings.Join(nodes, ","), nil
	case "SENTINEL":
		master, sentinels, ok := strings.Cut(addr, ",")
		if !ok || master == "" || sentinels == "" {
			return "", fmt.Errorf("REDIS_TYPE=SENTINEL: REDIS_URL must be master,host:port[,host:port...]")
		}
		scheme := "sentinel://"
		if tls {
			scheme = "sentinels://"
		}
		return scheme + userinfo + escapeAll(master) + "@" + sentinels + q, nil
	}
	return "", fmt.Errorf("REDIS_TYPE=%q: want SINGLE, SENTINEL or CLUSTER", typ)
}

// escapeAll percent-encodes every byte but letters, digits and -._~: the
// URL parsers of backend/redis split on ',' '@' '/' ':' before unescaping,
// which url.PathEscape and url.QueryEscape (which turns ' ' into '+')
// leave or change.
func escapeAll(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~", c) >= 0 {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

func orDefault(getenv func(string) string, name, def string) string {
	if v := getenv(name); v != "" {
		return v
	}
	return def
}

// peerBool reads a boolean variable as the peer does (strconv.ParseBool);
// a value that is no boolean reads as false, and is refused on its own.
func peerBool(getenv func(string) string, name, def string) bool {
	b, _ := strconv.ParseBool(orDefault(getenv, name, def))
	return b
}

// checkKind reports whether v is a value of kind k, as the peer parses it.
func checkKind(k peerKind, v string) error {
	var err error
	switch k {
	case kBool:
		_, err = strconv.ParseBool(v)
	case kNumber:
		_, err = strconv.ParseFloat(v, 64)
	case kDuration:
		_, err = time.ParseDuration(v)
	}
	if err != nil {
		return fmt.Errorf("is not a %s", [...]string{"", "", "boolean", "number", "duration"}[k])
	}
	return nil
}

// sameValue reports whether a and b are the same value of kind k.
func sameValue(k peerKind, a, b string) bool {
	switch k {
	case kWord:
		return strings.EqualFold(a, b)
	case kBool:
		x, err1 := strconv.ParseBool(a)
		y, err2 := strconv.ParseBool(b)
		return err1 == nil && err2 == nil && x == y
	case kNumber:
		x, err1 := strconv.ParseFloat(a, 64)
		y, err2 := strconv.ParseFloat(b, 64)
		return err1 == nil && err2 == nil && x == y
	case kDuration:
		x, err1 := time.ParseDuration(a)
		y, err2 := time.ParseDuration(b)
		return err1 == nil && err2 == nil && x == y
	}
	return a == b
}

// isServiceLink reports whether v looks like the variable Kubernetes sets
// for a Service (a Service "statsd" gives STATSD_PORT=tcp://10.0.0.7:8125):
// not a peer setting, which the peer could not even parse as a port.
func isServiceLink(k peerKind, v string) bool {
	return k == kNumber && (strings.HasPrefix(v, "tcp://") || strings.HasPrefix(v, "udp://"))
}

func shown(p peerVar, v string) string {
	if p.secret {
		return "(not shown)"
	}
	return strconv.Quote(v)
}

// applyPeerEnv reads envoyproxy/ratelimit's variables through getenv and,
// in mode, sets the flags of fs they map to (unless explicit, the flags
// given on the command line or as RLS_<FLAG>), or refuses them. It returns
// the notes to log and one error listing every refusal.
func applyPeerEnv(fs *flag.FlagSet, mode PeerEnvMode, getenv func(string) string, explicit map[string]bool) ([]PeerNote, error) {
	var notes []PeerNote
	var refusals []string
	note := func(level slog.Level, msg string, args ...any) {
		notes = append(notes, PeerNote{Level: level, Msg: msg, Args: args})
	}
	refuse := func(format string, args ...any) { refusals = append(refusals, fmt.Sprintf(format, args...)) }
	replacement := func(p peerVar) string {
		if p.flag == "" {
			return "not supported"
		}
		return "use --" + p.flag
	}
	byName := map[string]peerVar{}
	for _, p := range peerVars {
		byName[p.name] = p
	}
	mapped := map[string]bool{} // variables a peerMaps entry is to convert
	for name, why := range strayVars {
		if getenv(name) != "" {
			note(slog.LevelInfo, "not an envoyproxy/ratelimit setting: ignored: "+why, "var", name)
		}
	}
	for _, p := range peerVars {
		v := getenv(p.name)
		if v == "" {
			continue
		}
		if isServiceLink(p.kind, v) {
			note(slog.LevelInfo, "environment variable of a Kubernetes Service link, not an envoyproxy/ratelimit setting: ignored", "var", p.name, "value", v)
			continue
		}
		switch mode {
		case PeerEnvIgnore:
			note(slog.LevelWarn, "envoyproxy/ratelimit setting ignored (--peer-env=ignore)", "var", p.name, "value", shown(p, v), "sluice", replacement(p))
			continue
		case PeerEnvRefuse:
			refuse("%s=%s: an envoyproxy/ratelimit setting (--peer-env=refuse): %s", p.name, shown(p, v), replacement(p))
			continue
		}
		if err := checkKind(p.kind, v); err != nil {
			refuse("%s=%s %v", p.name, shown(p, v), err)
			continue
		}
		if p.inert != nil {
			if why := p.inert(getenv); why != "" {
				note(slog.LevelInfo, "envoyproxy/ratelimit setting accepted: "+why, "var", p.name)
				continue
			}
		}
		isOK := slices.ContainsFunc(p.ok, func(ok string) bool { return sameValue(p.kind, v, ok) })
		if p.anyOK || isOK {
			msg := "envoyproxy/ratelimit setting accepted: it changes nothing"
			if p.why != "" {
				msg = "envoyproxy/ratelimit setting accepted: " + p.why
			}
			level := slog.LevelInfo
			if p.warn && !isOK {
				level = slog.LevelWarn
			}
			note(level, msg, "var", p.name, "value", shown(p, v))
			continue
		}
		if p.flag != "" && explicit[p.flag] {
			note(slog.LevelInfo, "envoyproxy/ratelimit setting ignored: --"+p.flag+" is given, and wins", "var", p.name)
			continue
		}
		switch {
		case p.how == hMapped:
			mapped[p.name] = true
		case p.flag != "":
			refuse("%s=%s: %s; give --%s instead", p.name, shown(p, v), p.why, p.flag)
		default:
			refuse("%s=%s: not supported: %s", p.name, shown(p, v), p.why)
		}
	}
	for _, m := range peerMaps {
		var from []string
		for _, name := range m.vars {
			if mapped[name] {
				from = append(from, name)
			}
		}
		if len(from) == 0 {
			continue
		}
		val, err := m.convert(getenv)
		if err != nil {
			refuse("%v", err)
			continue
		}
		if val == "" {
			note(slog.LevelInfo, "envoyproxy/ratelimit setting read: it sets nothing here", "vars", strings.Join(from, ","), "flag", "--"+m.flag)
			continue
		}
		shownVal := strconv.Quote(val)
		for _, name := range from {
			if byName[name].secret {
				shownVal = "(not shown)"
			}
		}
		if err := fs.Set(m.flag, val); err != nil {
			refuse("%s: --%s=%s: %v", strings.Join(from, ", "), m.flag, shownVal, err)
			continue
		}
		note(slog.LevelInfo, "envoyproxy/ratelimit setting mapped", "vars", strings.Join(from, ","), "flag", "--"+m.flag, "value", shownVal)
	}
	if len(refusals) > 0 {
		return notes, fmt.Errorf("envoyproxy/ratelimit settings in the environment that rls serve does not honour (see docs/migrating-from-envoy-ratelimit.md; --peer-env=ignore starts anyway):\n  %s",
			strings.Join(refusals, "\n  "))
	}
	return notes, nil
}

// metricsAddr is --metrics-addr from USE_PROMETHEUS and PROMETHEUS_ADDR:
// the peer serves Prometheus' format on a listener of its own only with
// the first true.
func metricsAddr(getenv func(string) string) (string, error) {
	if !peerBool(getenv, "USE_PROMETHEUS", "false") {
		return "", nil
	}
	return orDefault(getenv, "PROMETHEUS_ADDR", ":9090"), nil
}

// tracingProtocol is --tracing-protocol from TRACING_ENABLED and
// TRACING_EXPORTER_PROTOCOL: with tracing on, the peer exports OTLP over
// HTTP/protobuf (its default, http) or gRPC to the collector of
// OTEL_EXPORTER_OTLP_ENDPOINT, which applyOTelEnv maps.
func tracingProtocol(getenv func(string) string) (string, error) {
	if !peerBool(getenv, "TRACING_ENABLED", "false") {
		return "", nil
	}
	switch p := orDefault(getenv, "TRACING_EXPORTER_PROTOCOL", "http"); strings.ToLower(p) {
	case "http":
		return tracing.ProtocolHTTP, nil
	case "grpc":
		return tracing.ProtocolGRPC, nil
	default:
		return "", fmt.Errorf("TRACING_EXPORTER_PROTOCOL=%q: want http or grpc", p)
	}
}

// tracingResource is --tracing-resource from the peer's names of the
// spans' service: service.name (its default RateLimit),
// service.namespace and service.instance.id when set.
func tracingResource(getenv func(string) string) (string, error) {
	r := tracing.Resource{attribute.String("service.name", orDefault(getenv, "TRACING_SERVICE_NAME", "RateLimit"))}
	if v := getenv("TRACING_SERVICE_NAMESPACE"); v != "" {
		r = append(r, attribute.String("service.namespace", v))
	}
	if v := getenv("TRACING_SERVICE_INSTANCE_ID"); v != "" {
		r = append(r, attribute.String("service.instance.id", v))
	}
	text, err := r.MarshalText()
	return string(text), err
}

// peerTracingOff reports whether envoyproxy/ratelimit's TRACING_ENABLED,
// read in --peer-env=map, is set to false: the peer then traces nothing,
// whatever OpenTelemetry's variables say, and neither does rls serve
// unless --tracing-endpoint is given.
func peerTracingOff(mode PeerEnvMode, getenv func(string) string) bool {
	return mode == PeerEnvMap && getenv("TRACING_ENABLED") != "" && !peerBool(getenv, "TRACING_ENABLED", "false")
}

// peerTracingOn reports whether TRACING_ENABLED, read in --peer-env=map,
// is true.
func peerTracingOn(mode PeerEnvMode, getenv func(string) string) bool {
	return mode == PeerEnvMap && peerBool(getenv, "TRACING_ENABLED", "false")
}
