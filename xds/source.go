package xds

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/jonboulle/clockwork"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/sluice-rls/sluice/audit"
	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/ruleset"
)

// DefaultNodeID is the default of --xds-node-id: envoyproxy/ratelimit's
// default CONFIG_GRPC_XDS_NODE_ID. The management server keys its
// snapshots by node ID; Envoy Gateway's is "envoy-ratelimit".
const DefaultNodeID = "default"

// DefaultBackoffMin and DefaultBackoffMax bound the wait before
// reconnecting to the management server: it starts at the first, doubles
// after each attempt that received nothing, up to the second, and is
// jittered to between half and all of that (see jitter).
const (
	DefaultBackoffMin = 500 * time.Millisecond
	DefaultBackoffMax = 30 * time.Second
)

// maxNackBytes caps the error detail of a NACK. Validation reports at most
// 100 problems, but names and values inside them come from the update.
const maxNackBytes = 16 << 10

// Options configure a Source.
type Options struct {
	Server      string            // management server, host:port (a gRPC target)
	NodeID      string            // node.id sent to the server; empty: DefaultNodeID
	NodeCluster string            // node.cluster sent to the server; optional
	DialOptions []grpc.DialOption // transport credentials and the like; none: plaintext

	Store       *ruleset.Store      // where updates are swapped in
	RuleOptions descriptors.Options // as for rule files (--merge-domains)
	Log         *slog.Logger
	// Reloads counts every update as a rule load (success: applied and
	// ACKed; error: NACKed); nil records nothing.
	Reloads *ruleset.ReloadMetrics
	Metrics *Metrics // nil records nothing
	// Audit records one audit.KindReload event per applied update: Subject
	// "<version_info> sha256:<hex>" (the SHA-256 of the update's resources,
	// decoded and encoded deterministically), every changed field; nil
	// records nothing. AuditNode names this node in the events.
	Audit     audit.Recorder
	AuditNode string

	// Clock times the reconnect backoff and the loads; nil is the real
	// clock.
	Clock clockwork.Clock
	// BackoffMin and BackoffMax bound the reconnect backoff; 0: the
	// defaults.
	BackoffMin, BackoffMax time.Duration

	// Limits bound one update; checked before it is rendered, parsed or
	// logged. Zero fields take the defaults.
	Limits Limits
}

// Source keeps a ruleset.Store up to date from an xDS management server.
// Build it with New and run it with Run; Version and Ready are safe for
// concurrent use.
type Source struct {
	opts    Options
	clock   clockwork.Clock
	version atomic.Pointer[string] // of the applied rules; nil before the first update
	ready   chan struct{}          // closed when the first update is applied
	once    sync.Once
	// applied is the fingerprint of the rules in use (nil before the
	// first update); only Run's goroutine touches it.
	applied *[sha256.Size]byte
	// refused is the last update refused after decoding, so that the same
	// update sent again is refused without being built again; only Run's
	// goroutine touches it.
	refused *refusedUpdate
}

// New checks opts and returns a Source that has not connected yet.
func New(opts Options) (*Source, error) {
	if opts.Server == "" {
		return nil, errors.New("xds: no management server address")
	}
	if opts.Store == nil || opts.Log == nil {
		return nil, errors.New("xds: Store and Log are required")
	}
	if opts.NodeID == "" {
		opts.NodeID = DefaultNodeID
	}
	if opts.BackoffMin <= 0 {
		opts.BackoffMin = DefaultBackoffMin
	}
	if opts.BackoffMax <= 0 {
		opts.BackoffMax = DefaultBackoffMax
	}
	if opts.BackoffMax < opts.BackoffMin {
		return nil, fmt.Errorf("xds: backoff max %v is below min %v", opts.BackoffMax, opts.BackoffMin)
	}
	opts.Limits = opts.Limits.withDefaults()
	// Plaintext unless opts.DialOptions set credentials (a later option
	// wins).
	opts.DialOptions = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts.DialOptions...)
	// A target or option grpc refuses fails here, once, not on every
	// reconnect.
	conn, err := grpc.NewClient(opts.Server, opts.DialOptions...)
	if err != nil {
		return nil, fmt.Errorf("xds: management server %q: %w", opts.Server, err)
	}
	conn.Close()
	s := &Source{opts: opts, clock: opts.Clock, ready: make(chan struct{})}
	if s.clock == nil {
		s.clock = clockwork.NewRealClock()
	}
	return s, nil
}

// Version returns the version_info of the rules in use, and false before
// the first update was applied.
func (s *Source) Version() (string, bool) {
	v := s.version.Load()
	if v == nil {
		return "", false
	}
	return *v, true
}

// Ready is closed once the first update has been applied.
func (s *Source) Ready() <-chan struct{} { return s.ready }

// Run subscribes to RateLimitConfig resources and applies every update
// until ctx is done, then returns nil. When the stream fails or the server
// goes away it reconnects, after a backoff with jitter on the Clock; the
// running rules stay in use meanwhile. The backoff doubles per reconnect
// up to BackoffMax and starts again from BackoffMin only after a stream
// that stayed open BackoffMax or longer: a server that answers and then
// closes every stream is retried ever more slowly, not in a loop. A new
// stream asks for the version last applied, as Envoy does, so a server
// whose rules did not change sends nothing again.
func (s *Source) Run(ctx context.Context) error {
	delay := s.opts.BackoffMin
	for {
		start := s.clock.Now()
		err := s.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if s.clock.Since(start) >= s.opts.BackoffMax {
			delay = s.opts.BackoffMin // a healthy stream: start over
		}
		wait := jitter(delay)
		s.opts.Log.Warn("xDS stream to the management server ended; the running rules stay in use; reconnecting",
			"server", s.opts.Server, "err", err, "in", wait)
		if !s.sleep(ctx, wait) {
			return nil
		}
		delay = min(2*delay, s.opts.BackoffMax)
	}
}

func (s *Source) node() *core.Node {
	return &core.Node{Id: s.opts.NodeID, Cluster: s.opts.NodeCluster, UserAgentName: "sluice"}
}

// session runs one ADS stream on a ClientConn of its own until it fails.
//
// The SotW exchange is written here on the generated ADS client instead
// of go-control-plane's pkg/client/sotw/v3 (v0.14.0), which sluice cannot
// use as it is: its Response carries the resources but not the
// version_info that /rlconfig, ratelimit_config_info and the logs report,
// and its InitConnect ACKs the last response received, so a reconnect
// after a NACK would tell the server the refused version is in use.
//
// A ClientConn per stream, not one for the whole run: grpc-go's own
// reconnect backoff (up to 120 s, on the real clock) would otherwise stack
// on top of ours, and tests could not drive it with a fake clock.
//
// A NACK makes a SotW server send the refused update again at once (the
// NACK names the version in use, not the refused one), so NACKs in a row
// are spaced: the first goes at once, each next one after a wait that
// doubles from BackoffMin to BackoffMax, with jitter; an ACK starts over.
func (s *Source) session(ctx context.Context) error {
	conn, err := grpc.NewClient(s.opts.Server, s.opts.DialOptions...)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return fmt.Errorf("opening the ADS stream: %w", err)
	}
	applied, _ := s.Version()
	// The first request names the node; the server keys its snapshots by
	// node ID. No resource names: all RateLimitConfig resources (wildcard).
	req := &discovery.DiscoveryRequest{Node: s.node(), TypeUrl: TypeURL, VersionInfo: applied}
	if err := stream.Send(req); err != nil {
		return fmt.Errorf("subscribing: %w", err)
	}
	s.opts.Metrics.setConnected(true)
	defer s.opts.Metrics.setConnected(false)
	s.opts.Log.Info("xDS stream open; waiting for RateLimitConfig resources", "server", s.opts.Server, "node_id", s.opts.NodeID)
	var nackDelay time.Duration // 0: the last answer was an ACK
	for {
		resp, err := stream.Recv()
		if err != nil {
			return err
		}
		version := resp.GetVersionInfo()
		// ACK: the version just applied; NACK: the last one applied, and
		// why not this one. Both carry the response's nonce.
		req := &discovery.DiscoveryRequest{TypeUrl: TypeURL, ResponseNonce: resp.GetNonce()}
		if err := s.apply(ctx, resp.GetResources(), version); err != nil {
			req.VersionInfo, _ = s.Version()
			req.ErrorDetail = &status.Status{Code: int32(codes.InvalidArgument), Message: nackMessage(version, err)}
			if nackDelay > 0 {
				wait := jitter(nackDelay)
				s.opts.Log.Warn("xDS update rejected again; waiting before the NACK", "version", version, "in", wait)
				if !s.sleep(ctx, wait) {
					return ctx.Err()
				}
				nackDelay = min(2*nackDelay, s.opts.BackoffMax)
			} else {
				nackDelay = s.opts.BackoffMin
			}
		} else {
			req.VersionInfo = version
			nackDelay = 0
		}
		if err := stream.Send(req); err != nil {
			return fmt.Errorf("answering version %q: %w", version, err)
		}
	}
}

// maxLoggedError caps the error a rejection's log line carries: the
// first problem only, whose names and values come from the update.
const maxLoggedError = 512

// apply builds the rules of one update and swaps them in, or logs, counts
// and returns why not; the running rules then stay. An update whose
// resources are those of the rules in use (the same fingerprint, whatever
// its version) swaps nothing and writes no audit event.
func (s *Source) apply(ctx context.Context, resources []*anypb.Any, version string) error {
	conv, err := convertKnown(resources, s.opts.Limits, s.opts.RuleOptions, known{applied: s.applied, refused: s.refused})
	if err != nil {
		if conv.fp != ([sha256.Size]byte{}) {
			s.refused = &refusedUpdate{fp: conv.fp, err: err}
		}
		s.opts.Reloads.Loaded(false, time.Time{})
		s.logRejected(version, len(resources), err)
		return err
	}
	now := s.clock.Now()
	s.opts.Reloads.Loaded(true, now)
	s.version.Store(&version)
	s.opts.Metrics.setVersion(version)
	subject := version + " sha256:" + hex.EncodeToString(conv.fp[:])
	if conv.cfg == nil {
		s.opts.Log.Info("rules from xDS unchanged; nothing to apply", "version", version, "resources", len(resources), "subject", subject)
		s.once.Do(func() { close(s.ready) })
		return nil
	}
	old := s.opts.Store.Swap(conv.cfg)
	s.applied = &conv.fp
	cfg := conv.cfg
	ruleset.LogWarnings(s.opts.Log, cfg) // what the peer loads but sluice finds suspect
	// Only the changes listed are rendered; the rest are counted.
	changes, counted := ruleset.DiffListing(old, cfg, maxListedChanges)
	logChanges(s.opts.Log, changes, counted)
	s.opts.Log.Info("rules from xDS applied", "version", version, "resources", len(resources), "rule_count", cfg.Len(), "changed", counted.Total(), "subject", subject)
	if s.opts.Audit != nil {
		s.opts.Audit.Record(ctx, audit.Event{
			Time: now, Kind: audit.KindReload, Node: s.opts.AuditNode, Reason: "xDS update from " + s.opts.Server,
			Subject: subject, Changes: auditChanges(changes, counted),
		})
	}
	if len(resources) == 0 {
		s.opts.Log.Warn("the xDS update holds no RateLimitConfig: no rules, every request is allowed", "version", version)
	}
	s.once.Do(func() { close(s.ready) })
	return nil
}

// logRejected logs a refused update in one line: the first resource
// refused, its size on the wire and its first problem, cut to
// maxLoggedError bytes. The update is never rendered into the log; the
// NACK carries every problem (capped at maxNackBytes).
func (s *Source) logRejected(version string, resources int, err error) {
	attrs := []any{"version", version, "resources", resources}
	var ref *refusal
	if errors.As(err, &ref) {
		if ref.resource != "" {
			attrs = append(attrs, "resource", ref.resource, "bytes", ref.bytes)
		}
		attrs = append(attrs, "refused", len(ref.all)+ref.more)
		err = ref.first
	}
	msg := err.Error()
	if len(msg) > maxLoggedError {
		msg = strings.ToValidUTF8(msg[:maxLoggedError], "") + "…"
	}
	attrs = append(attrs, "err", msg)
	s.opts.Log.Error("xDS update rejected (NACK); keeping the running rules", attrs...)
}

// nackMessage is the error detail of a NACK: the version refused and every
// problem, capped at maxNackBytes.
func nackMessage(version string, err error) string {
	msg := fmt.Sprintf("sluice rejected RateLimitConfig version %q; the previous rules stay in use:\n%v", version, err)
	if len(msg) > maxNackBytes {
		cut := strings.ToValidUTF8(msg[:maxNackBytes], "")
		msg = fmt.Sprintf("%s\n… (%d more bytes)", cut, len(msg)-len(cut))
	}
	return msg
}

// jitter returns a wait between d/2 and d ("equal jitter"), so that
// replicas cut off together do not reconnect together.
func jitter(d time.Duration) time.Duration {
	half := d / 2
	return half + rand.N(d-half+1)
}

// sleep waits d on the clock; false when ctx ended first.
func (s *Source) sleep(ctx context.Context, d time.Duration) bool {
	t := s.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.Chan():
		return true
	}
}
