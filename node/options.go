package node

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/sluice-rls/sluice/backend/lease"
	"github.com/sluice-rls/sluice/fallback"
	"github.com/sluice-rls/sluice/service"
	"github.com/sluice-rls/sluice/tracing"
)

// DefaultFallbackNodesInitial is N for the fallback share while a node has
// not read the node registry and --fallback-nodes-initial is not set. A
// node that never reached Redis (started during an outage, or with a wrong
// password) does not know the fleet; assuming it is alone (N = 1) let every
// such node admit the whole global rate. With 10, up to ten such nodes
// together stay within the rate; a smaller fleet admits less until it
// reaches Redis.
const DefaultFallbackNodesInitial = 10

// DefaultTracingSampleRatio is the default of --tracing-sample-ratio.
const DefaultTracingSampleRatio = 0.01

// Rules are the flags that say which rules to load and how. `rls serve`
// and `rls validate` register the very same ones (flags registers them), so that
// validate accepts exactly what serve would load.
type Rules struct {
	Config       string // rule file or directory; empty: serve loads the embedded example
	MergeDomains bool   // rule files sharing a domain are merged instead of refused
	MaxRuleBytes int64  // most bytes read from all rule files of one load together
	// GrayKey is the descriptor key whose value true marks a gray request;
	// serve removes its entries before matching, and a load warns about
	// rules keyed on it. Empty: no gray marker.
	GrayKey string
}

// Validate checks the rule-loading options.
func (r Rules) Validate() error {
	if r.MaxRuleBytes < 1 {
		return fmt.Errorf("--max-rule-bytes must be ≥ 1, not %d", r.MaxRuleBytes)
	}
	return nil
}

// Options are what one node runs with: its listeners, its rule source,
// its Redis, its limits. Each field is a flag of `rls serve` (named in the
// comments and in the errors of Validate); the zero value is not valid,
// the flags' defaults are.
type Options struct {
	GRPCAddr string
	HTTPAddr string
	// MetricsAddr, when set, serves /metrics (at MetricsPath, "/metrics"
	// when empty) on a listener of its own too, as envoyproxy/ratelimit's
	// PROMETHEUS_ADDR does: --metrics-addr, --metrics-path.
	MetricsAddr string
	MetricsPath string
	Rules           // --config, --merge-domains, --max-rule-bytes, --gray-key
	XDS         XDS // --xds-*: the rules from an xDS management server instead of files
	// Overrides: --admin-token-file, --override-file, --override-resync.
	Overrides Overrides
	// AdaptiveConfig is --adaptive-config: the adaptive limits' file
	// (docs/adaptive.md); empty: off.
	AdaptiveConfig string

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
	GRPCMaxConnAge       time.Duration // a connection this old gets GOAWAY, so clients rebalance; 0: never
	GRPCMaxConnAgeGrace  time.Duration // calls in flight at --grpc-max-conn-age may finish within this
	GRPCKeepaliveMinTime time.Duration // clients pinging more often are disconnected
	GRPCMaxConns         int           // open connections on the gRPC listener; more wait in the backlog (0: no cap)
	GRPCFirstCallTimeout time.Duration // a connection that starts no call within this is closed (0: never)

	Redis        string
	RedisCA      string // PEM bundle trusted for rediss:// (default: the system roots)
	RedisTLSCert string // client certificate (PEM) presented to a TLS Redis
	RedisTLSKey  string // its private key (PEM)
	RedisTimeout time.Duration
	RedisFailure fallback.Mode
	// Consistency is the global buckets' consistency when a rule does not
	// set one (rate_limit.consistency).
	Consistency lease.Consistency
	// LeasePeriod is how long a node keeps unused leased tokens.
	LeasePeriod   time.Duration
	FallbackNodes int
	// FallbackNodesInitial is N until the node has read the node registry
	// (0: DefaultFallbackNodesInitial).
	FallbackNodesInitial int
	// Share is the part f (0 ≤ f < 1) of the global limit held as
	// standing shares by every rule that may hold them and sets no share
	// (descriptors.Rule.ShareMillionths); 0: none. QuotaMode turns it off:
	// every rule is then a quota, whose charges land in Redis.
	Share float64

	Emergency Emergency // --emergency-key, --emergency-secret-file

	// How the service answers and how much of a request it takes:
	// --shadow, --quota-mode, --response-metadata, --ratelimit-header*,
	// --refusal-details, --log-refusals, --top-refused, --max-descriptors,
	// --max-entries, --max-value-bytes, --max-metric-values, --max-tenants.
	service.Settings

	MaxBuckets int
	Pprof      bool

	TLSCert     string
	TLSKey      string
	TLSClientCA string
	// TLSClientSAN is a comma-separated list: with mTLS, a client
	// certificate must carry one of these names (DNS, IP or URI SAN).
	TLSClientSAN string
	// AdminTLSClientCA and AdminTLSClientSAN are the admin listener's
	// own: operators' client certificates, never Envoy's.
	AdminTLSClientCA  string
	AdminTLSClientSAN string

	DrainTimeout time.Duration

	// OpenTelemetry tracing over OTLP (TracingProtocol: tracing.ProtocolGRPC
	// or tracing.ProtocolHTTP): off while TracingEndpoint is empty.
	// TracingSampleRatio samples root traces; a request Envoy sent with a
	// sampled traceparent is always traced. TracingResource's attributes
	// win over the environment's (OTEL_SERVICE_NAME, ...).
	TracingEndpoint    string
	TracingProtocol    string
	TracingSampleRatio float64
	TracingInsecure    bool
	TracingResource    tracing.Resource
	Audit              Audit // the audit trail's Redis stream

	// Statsd: envoyproxy/ratelimit's statsd counters (package statsd).
	Statsd Statsd

	// Not flags: what the caller gives the node.
	Logger *slog.Logger // where the node logs; nil: nowhere
	Build  Build        // the running binary, for ratelimit_build_info, traces and the "serving" line
}

// MaxTenantsBound bounds --max-tenants: each tenant kept is a series per
// node and rule for as long as the rule lives; a larger cap is a typing
// mistake, and a rule with more tenants to review wants rules of its own.
const MaxTenantsBound = 10000

// MaxTopRefused bounds --top-refused: each counter may hold a value of up
// to --max-value-bytes, for every tracked rule and minute.
const MaxTopRefused = 256

// Validate checks the options as `rls serve` does its flags, naming the
// flags in its errors.
func (s Options) Validate() error {
	if err := s.Rules.Validate(); err != nil {
		return err
	}
	if err := s.XDS.validate(s.Config); err != nil {
		return err
	}
	if err := s.Emergency.validate(s.GrayKey); err != nil {
		return err
	}
	if err := s.Statsd.validate(); err != nil {
		return err
	}
	if s.MetricsPath != "" && !strings.HasPrefix(s.MetricsPath, "/") {
		return fmt.Errorf("--metrics-path %q: want a path starting with /", s.MetricsPath)
	}
	if err := s.Audit.validate(); err != nil {
		return err
	}
	if err := s.Overrides.validate(s.Redis); err != nil {
		return err
	}
	if s.RedisTimeout <= 0 {
		return fmt.Errorf("--redis-timeout must be positive, not %v", s.RedisTimeout)
	}
	if s.LeasePeriod <= 0 {
		return fmt.Errorf("--lease-period must be positive, not %v", s.LeasePeriod)
	}
	for _, h := range []struct{ flag, name string }{
		{"--ratelimit-header-limit", s.HeaderLimit},
		{"--ratelimit-header-remaining", s.HeaderRemaining},
		{"--ratelimit-header-reset", s.HeaderReset},
	} {
		if !httpguts.ValidHeaderFieldName(h.name) {
			return fmt.Errorf("%s: %q is not a valid HTTP header name", h.flag, h.name)
		}
	}
	if (s.TLSCert == "") != (s.TLSKey == "") {
		return fmt.Errorf("--tls-cert and --tls-key go together")
	}
	if s.TLSClientCA != "" && s.TLSCert == "" {
		return fmt.Errorf("--tls-client-ca needs --tls-cert and --tls-key")
	}
	if s.TLSClientSAN != "" && (s.TLSClientCA == "" || strings.Trim(s.TLSClientSAN, ", ") == "") {
		return fmt.Errorf("--tls-client-san needs --tls-client-ca and at least one name")
	}
	if s.AdminTLSClientCA != "" && s.TLSCert == "" {
		return fmt.Errorf("--admin-tls-client-ca needs --tls-cert and --tls-key (the admin address serves TLS with that certificate)")
	}
	if s.AdminTLSClientCA != "" && s.AdminAddr == "" {
		return fmt.Errorf("--admin-tls-client-ca needs --admin-addr")
	}
	if s.AdminTLSClientSAN != "" && (s.AdminTLSClientCA == "" || strings.Trim(s.AdminTLSClientSAN, ", ") == "") {
		return fmt.Errorf("--admin-tls-client-san needs --admin-tls-client-ca and at least one name")
	}
	if (s.RedisTLSCert == "") != (s.RedisTLSKey == "") {
		return fmt.Errorf("--redis-tls-cert and --redis-tls-key go together")
	}
	if s.RedisTLSCert != "" && s.Redis == "" {
		return fmt.Errorf("--redis-tls-cert needs --redis")
	}
	if s.HTTPReadTimeout < 0 || s.HTTPWriteTimeout < 0 || s.HTTPIdleTimeout < 0 || s.HTTPMaxConns < 0 || s.GRPCMaxConnIdle < 0 || s.GRPCKeepaliveMinTime < 0 || s.GRPCMaxConnAge < 0 || s.GRPCMaxConnAgeGrace < 0 || s.GRPCMaxConns < 0 || s.GRPCFirstCallTimeout < 0 {
		return fmt.Errorf("--http-*-timeout, --http-max-conns, --grpc-max-conns, --grpc-first-call-timeout, --grpc-max-conn-idle, --grpc-max-conn-age(-grace) and --grpc-keepalive-min-time must be ≥ 0")
	}
	if s.GRPCHandshakeTimeout <= 0 {
		return fmt.Errorf("--grpc-handshake-timeout must be positive, not %v", s.GRPCHandshakeTimeout)
	}
	if !(s.TracingSampleRatio >= 0 && s.TracingSampleRatio <= 1) {
		return fmt.Errorf("--tracing-sample-ratio must be in [0, 1], not %v", s.TracingSampleRatio)
	}
	if s.TracingProtocol != "" && !slices.Contains(tracing.Protocols(), s.TracingProtocol) {
		return fmt.Errorf("--tracing-protocol %q: want %s", s.TracingProtocol, strings.Join(tracing.Protocols(), " or "))
	}
	if s.MaxTenants < 1 || s.MaxTenants > MaxTenantsBound {
		return fmt.Errorf("--max-tenants must be in [1, %d], not %d", MaxTenantsBound, s.MaxTenants)
	}
	if !(s.Share >= 0 && s.Share < 1) {
		return fmt.Errorf("--share must be from 0 to below 1 (the part of each global limit held as standing shares), not %v", s.Share)
	}
	if s.TopRefused < 0 || s.TopRefused > MaxTopRefused {
		return fmt.Errorf("--top-refused must be in [0, %d], not %d", MaxTopRefused, s.TopRefused)
	}
	if s.FallbackNodes < 0 || s.FallbackNodesInitial < 0 || s.MaxDescriptors < 1 || s.MaxEntries < 1 || s.MaxValueBytes < 1 || s.MaxBuckets < 1 ||
		s.MaxMetricValues < 1 || s.RefusalLogEvery < 0 {
		return fmt.Errorf("--fallback-nodes, --fallback-nodes-initial and --log-refusals must be ≥ 0 and --max-* flags ≥ 1")
	}
	return nil
}

// Audit are the flags of the audit trail's Redis stream. Every audit event
// also goes to the log; with --redis it goes to the stream too, unless
// Stream is empty.
type Audit struct {
	Stream string // key of the stream; "": no stream
	MaxLen int64  // about how many events the stream keeps
}

func (a Audit) validate() error {
	if a.MaxLen <= 0 {
		return fmt.Errorf("--audit-stream-max-len must be positive, not %d", a.MaxLen)
	}
	return nil
}

// Emergency are the flags of the emergency channel (docs/operations.md,
// "The emergency channel"). Both empty, the default: the channel is off.
type Emergency struct {
	// Key is the descriptor key Envoy sets from the emergency header.
	Key string
	// SecretFile holds the hex SHA-256 digests of the accepted secrets.
	SecretFile string
}

func (e Emergency) validate(grayKey string) error {
	switch {
	case e.Key == "" && e.SecretFile == "":
		return nil
	case e.Key == "":
		return errors.New("--emergency-secret-file needs --emergency-key")
	case e.SecretFile == "":
		return errors.New("--emergency-key needs --emergency-secret-file")
	case e.Key == grayKey:
		return fmt.Errorf("--emergency-key and --gray-key are both %q", e.Key)
	}
	return nil
}

// Overrides are the flags of runtime overrides and of the admin
// endpoint that changes them (docs/operating-limits.md).
type Overrides struct {
	// AdminTokenFile holds the bearer tokens of /overrides on the admin
	// listener, one "name:token" a line; re-read when it changes.
	AdminTokenFile string
	// File persists this node's overrides without Redis; empty: memory
	// only, lost at restart.
	File string
	// Resync is the longest time between two reads of the override store.
	Resync time.Duration
	// MaxExpiry is the furthest expiry of a loosening override (allow,
	// shadow, scale above 1, a higher limit), which must have one.
	MaxExpiry time.Duration
}

func (o Overrides) validate(redis string) error {
	if o.Resync <= 0 || o.Resync > time.Second {
		return fmt.Errorf("--override-resync must be in (0, 1s] (overrides reach every node within 1 s), not %v", o.Resync)
	}
	if o.MaxExpiry <= 0 {
		return fmt.Errorf("--override-max-expiry must be positive, not %v", o.MaxExpiry)
	}
	if o.File != "" && redis != "" {
		return fmt.Errorf("--override-file is for nodes without --redis: with Redis, overrides live in Redis")
	}
	return nil
}

// XDS are the flags that take the rules from an xDS management server
// instead of files: off while Server is empty.
type XDS struct {
	Server        string // management server host:port; set: the rules come from xDS
	NodeID        string // node.id: the server keys its snapshots by it
	NodeCluster   string // node.cluster; optional
	TLSCA         string // CA bundle (PEM) to verify the server; set: TLS
	TLSCert       string // client certificate (PEM) for mTLS
	TLSKey        string // client private key (PEM)
	TLSServerName string // name to verify the server's certificate against (default: the host of Server)
	BackoffMin    time.Duration
	BackoffMax    time.Duration
	// MaxResources, MaxDescriptors and MaxDepth bound one update (with
	// --max-rule-bytes, its bytes): see xds.Limits.
	MaxResources   int
	MaxDescriptors int
	MaxDepth       int
	// ReadyBeforeRules reports ready (/healthcheck 200, gRPC health
	// SERVING) from the start, before the first update, as
	// envoyproxy/ratelimit with FORCE_START_WITHOUT_INITIAL_CONFIG=true;
	// false: not ready until the first update is applied.
	ReadyBeforeRules bool
}

func (x XDS) validate(config string) error {
	if x.Server == "" {
		if x.ReadyBeforeRules {
			return fmt.Errorf("--xds-ready-before-rules needs --xds-server")
		}
		return nil
	}
	switch {
	case config != "":
		return fmt.Errorf("--config and --xds-server are two sources of rules: give one (unset RLS_CONFIG or RLS_XDS_SERVER)")
	case x.NodeID == "":
		return fmt.Errorf("--xds-node-id must not be empty with --xds-server")
	case (x.TLSCert == "") != (x.TLSKey == ""):
		return fmt.Errorf("--xds-tls-cert and --xds-tls-key go together")
	case x.TLSCert != "" && x.TLSCA == "":
		return fmt.Errorf("--xds-tls-cert needs --xds-tls-ca (TLS to the xDS server is on when a CA is given)")
	case x.TLSServerName != "" && x.TLSCA == "":
		return fmt.Errorf("--xds-tls-server-name needs --xds-tls-ca")
	case x.MaxResources <= 0 || x.MaxDescriptors <= 0 || x.MaxDepth <= 0:
		return fmt.Errorf("--xds-max-resources, --xds-max-descriptors and --xds-max-depth must be positive, not %d, %d and %d", x.MaxResources, x.MaxDescriptors, x.MaxDepth)
	case x.MaxDepth > 64:
		return fmt.Errorf("--xds-max-depth %d: rule files nest at most 64 levels, and xDS resources are read as rule files", x.MaxDepth)
	case x.BackoffMin <= 0 || x.BackoffMax < x.BackoffMin:
		return fmt.Errorf("--xds-backoff-min must be positive and --xds-backoff-max at least as long, not %v and %v", x.BackoffMin, x.BackoffMax)
	}
	return nil
}
