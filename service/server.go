package service

import (
	"cmp"
	"context"
	"log/slog"
	"sync"
	"sync/atomic"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/jonboulle/clockwork"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-rls/sluice/bucket"
)

// Defaults for Options' request-size limits (docs/operations.md, "Malformed requests").
const (
	DefaultMaxDescriptors = 256
	DefaultMaxEntries     = 32
	DefaultMaxValueBytes  = 1024
	DefaultGrayKey        = "gray"
)

// Default names of the draft-03 headers (Options.RateLimitHeaders), as
// envoyproxy/ratelimit names them by default.
const (
	DefaultHeaderLimit     = "RateLimit-Limit"
	DefaultHeaderRemaining = "RateLimit-Remaining"
	DefaultHeaderReset     = "RateLimit-Reset"
)

// Layer is the layer that decided. Its String is the value of the
// x-ratelimit-layer header, the JSON body's layer, the layer label of
// ratelimit_decisions_total and the sluice.layer span attribute.
type Layer uint8

const (
	LayerLocal    Layer = iota // the per-node layer
	LayerGlobal                // the cluster-wide layer
	LayerFallback              // the fail-open switch, while Redis is failing
	LayerNone                  // no layer decided (span attribute only)
)

// String returns the layer's name: local, global, fallback or none.
func (l Layer) String() string {
	switch l {
	case LayerLocal:
		return "local"
	case LayerGlobal:
		return "global"
	case LayerFallback:
		return "fallback"
	}
	return "none"
}

// Options configures a Server. Rules and Local are required; Global may be
// nil, in which case rules' global limits are not enforced.
type Options struct {
	Rules RuleSource
	Local bucket.Limiter // per-node layer (backend/memory)
	// Global is the cluster-wide layer: backend/redis behind the fail-open
	// switch (package fallback), or backend/memory without Redis. Its
	// Shared method chooses its bucket keys: the same on every node
	// (bucket.SumKey) when shared, else the faster node-local hash.
	Global bucket.Limiter

	Clock   clockwork.Clock // times decisions; nil = the real clock
	Logger  *slog.Logger    // nil = discard
	Metrics *Metrics        // nil = no metrics

	// GrayKey is the descriptor key whose value "true" marks a request gray
	// (doubled local limits); its entries are stripped before matching.
	// Empty: no gray marker, and every entry is matched. rls serve's
	// --gray-key defaults to DefaultGrayKey.
	GrayKey string
	// EmergencyKey is the descriptor key of the emergency channel: a
	// request with an entry of this key whose value Emergency accepts is
	// allowed whatever the limits, counted and logged (emergency.go).
	// Its entries are stripped before matching whether the secret is
	// right or not, so the value never reaches a bucket key, a metric
	// label or a log. Empty (the default): the channel is off.
	EmergencyKey string
	// Emergency holds the accepted secrets; nil accepts none.
	Emergency EmergencySecrets
	// Settings are how the server answers and how much of a request it
	// takes.
	Settings
	// TopRefusedRules caps the rules Settings.TopRefused tracks; default
	// DefaultTopRefusedRules.
	TopRefusedRules int

	// Overrides are the runtime overrides (override.Manager); nil: none.
	Overrides OverrideSource

	// Tracer writes a span per ShouldRateLimit, the child of the W3C trace
	// context (traceparent) in the call's gRPC metadata. Its sampler is
	// taken to be parent-based: a call whose traceparent says "not
	// sampled" gets no span, without asking it. Nil: a no-op tracer, and a
	// request costs nothing more than without tracing.
	Tracer trace.Tracer
}

// Settings are the options of a Server that an operator chooses (rls
// serve's flags set them; node.Options carries them whole): how it
// answers, and how much of a request it takes. The zero value answers as
// the defaults say.
type Settings struct {
	// Shadow puts every rule in shadow mode, as envoyproxy/ratelimit's
	// SHADOW_MODE: decide and count, answer OK overall, while each
	// refused descriptor's status still says OVER_LIMIT.
	Shadow bool
	// QuotaMode makes every rule a quota (descriptors.Rule.QuotaMode): a
	// request is refused only when every descriptor of it, unlimited ones
	// aside, is refused.
	QuotaMode bool
	// ResponseMetadata sets the response's dynamic_metadata, as
	// envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA: the domain, the
	// descriptors as sent (entries "key=value", limit override, hits_addend),
	// the request's hits_addend, and the metadata of the rules that matched
	// and did not refuse (rule file field metadata).
	ResponseMetadata bool
	RateLimitHeaders bool // add draft-03 RateLimit-* headers to every response
	// HeaderLimit, HeaderRemaining and HeaderReset name the draft-03
	// headers; empty: DefaultHeaderLimit, DefaultHeaderRemaining,
	// DefaultHeaderReset.
	HeaderLimit, HeaderRemaining, HeaderReset string
	// NoRefusalDetails leaves out what sluice adds to a refusal beyond
	// envoyproxy/ratelimit's answer: the retry-after and x-ratelimit-*
	// headers and the JSON body.
	NoRefusalDetails bool
	RefusalLogEvery  int // log one refused request in N (0 = none)
	// TopRefused keeps, per rule, the values refused most over the last
	// minutes in TopRefused counters per minute (GET /usage/top); 0: off.
	TopRefused int

	MaxDescriptors int // per request; default 256
	MaxEntries     int // per descriptor; default 32
	MaxValueBytes  int // per key or value; default 1024

	// MaxMetricValues caps the rule labels that carry request values
	// (detailed_metric, value_to_metric) in Metrics; values beyond it are
	// counted under "<rule path>:overflow". Default DefaultMaxMetricValues.
	MaxMetricValues int

	// MaxTenants caps, per rule with utilisation, the tenants whose tokens
	// Metrics reports each under its own label; later tenants are counted
	// together under tenant="_other". Default DefaultMaxTenants.
	MaxTenants int
}

// Server implements rlsv3.RateLimitServiceServer. Build it with New.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer

	opts       Options
	nodeKeys   bucket.NodeHasher
	sharedKeys bool // opts.Global is shared: its keys are bucket.SumKey
	log        *slog.Logger
	clock      clockwork.Clock
	scratch    sync.Pool     // *scratch: per-request buffers, so the hot path does not allocate
	refusals   atomic.Uint64 // refused requests, for sampled logging
	tracer     trace.Tracer  // never nil
	traced     bool          // opts.Tracer was set
	startRoot  startFunc     // starts a span without a parent (tracer.Start, or its StartRoot)
	tapped     atomic.Bool   // a gRPC call came through TapHandle
	top        *topRefused   // nil when Options.TopRefused is 0
}

// New returns a Server deciding with opts.
func New(opts Options) *Server {
	if opts.MaxDescriptors <= 0 {
		opts.MaxDescriptors = DefaultMaxDescriptors
	}
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = DefaultMaxEntries
	}
	if opts.MaxValueBytes <= 0 {
		opts.MaxValueBytes = DefaultMaxValueBytes
	}
	if opts.MaxMetricValues <= 0 {
		opts.MaxMetricValues = DefaultMaxMetricValues
	}
	opts.HeaderLimit = cmp.Or(opts.HeaderLimit, DefaultHeaderLimit)
	opts.HeaderRemaining = cmp.Or(opts.HeaderRemaining, DefaultHeaderRemaining)
	opts.HeaderReset = cmp.Or(opts.HeaderReset, DefaultHeaderReset)
	opts.Metrics.capValues(opts.MaxMetricValues)
	if opts.MaxTenants <= 0 {
		opts.MaxTenants = DefaultMaxTenants
	}
	opts.Metrics.capTenants(opts.MaxTenants)
	s := &Server{opts: opts, log: opts.Logger, clock: opts.Clock, nodeKeys: bucket.NewNodeHasher()}
	s.sharedKeys = opts.Global != nil && opts.Global.Shared()
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.clock == nil {
		s.clock = clockwork.NewRealClock()
	}
	s.scratch.New = func() any { return new(scratch) }
	s.top = newTopRefused(opts.TopRefused, opts.TopRefusedRules)
	s.tracer, s.traced = opts.Tracer, opts.Tracer != nil
	if !s.traced {
		s.tracer = noop.NewTracerProvider().Tracer("")
	}
	s.startRoot = rootStart(s.tracer)
	return s
}

// ShouldRateLimit decides one request. Malformed or oversized requests get
// codes.InvalidArgument; every other request gets an answer, even when the
// global layer fails (the request is then decided by what did answer).
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if s.traced {
		return s.shouldRateLimitTraced(ctx, req)
	}
	return s.shouldRateLimit(ctx, req, nil)
}

// shouldRateLimit is ShouldRateLimit; note, when not nil, learns how the
// request was decided for its span.
func (s *Server) shouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest, note *traceNote) (*rlsv3.RateLimitResponse, error) {
	start := s.clock.Now()
	if err := s.checkRequest(req); err != nil {
		s.opts.Metrics.invalidRequest()
		s.log.Debug("invalid request: answered InvalidArgument, which Envoy lets through", "err", err)
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	resp, err := s.decide(ctx, req, note)
	if err != nil {
		return nil, err
	}
	s.opts.Metrics.observeDuration(s.clock.Since(start))
	return resp, nil
}
