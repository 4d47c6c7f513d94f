package xds

import (
	"context"
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

	// Clock times the reconnect backoff and the loads; nil is the real
	// clock.
	Clock clockwork.Clock
	// BackoffMin and BackoffMax bound the reconnect backoff; 0: the
	// defaults.
	BackoffMin, BackoffMax time.Duration
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
// running rules stay in use meanwhile. A new stream asks for the version
// last applied, as Envoy does, so a server whose rules did not change
// sends nothing again.
func (s *Source) Run(ctx context.Context) error {
	delay := s.opts.BackoffMin
	for {
		got, err := s.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if got {
			delay = s.opts.BackoffMin
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
// got reports whether the server sent anything, which resets the backoff.
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
func (s *Source) session(ctx context.Context) (got bool, err error) {
	conn, err := grpc.NewClient(s.opts.Server, s.opts.DialOptions...)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream
	stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return false, fmt.Errorf("opening the ADS stream: %w", err)
	}
	applied, _ := s.Version()
	// The first request names the node; the server keys its snapshots by
	// node ID. No resource names: all RateLimitConfig resources (wildcard).
	req := &discovery.DiscoveryRequest{Node: s.node(), TypeUrl: TypeURL, VersionInfo: applied}
	if err := stream.Send(req); err != nil {
		return false, fmt.Errorf("subscribing: %w", err)
	}
	s.opts.Metrics.setConnected(true)
	defer s.opts.Metrics.setConnected(false)
	s.opts.Log.Info("xDS stream open; waiting for RateLimitConfig resources", "server", s.opts.Server, "node_id", s.opts.NodeID)
	for {
		resp, err := stream.Recv()
		if err != nil {
			return got, err
		}
		got = true
		version := resp.GetVersionInfo()
		// ACK: the version just applied; NACK: the last one applied, and
		// why not this one. Both carry the response's nonce.
		req := &discovery.DiscoveryRequest{TypeUrl: TypeURL, ResponseNonce: resp.GetNonce()}
		if err := s.apply(resp.GetResources(), version); err != nil {
			req.VersionInfo, _ = s.Version()
			req.ErrorDetail = &status.Status{Code: int32(codes.InvalidArgument), Message: nackMessage(version, err)}
		} else {
			req.VersionInfo = version
		}
		if err := stream.Send(req); err != nil {
			return got, fmt.Errorf("answering version %q: %w", version, err)
		}
	}
}

// apply builds the rules of one update and swaps them in, or logs, counts
// and returns why not; the running rules then stay.
func (s *Source) apply(resources []*anypb.Any, version string) error {
	files, err := ruleFiles(resources)
	var cfg *descriptors.Config
	if err == nil {
		cfg, err = build(files, s.opts.RuleOptions)
	}
	if err != nil {
		s.opts.Reloads.Loaded(false, time.Time{})
		s.opts.Log.Error("xDS update rejected (NACK); keeping the running rules", "version", version, "err", err)
		for _, f := range files {
			// The errors' line:column refer to these renderings.
			s.opts.Log.Warn("rejected xDS update: resource as a rule file", "version", version, "resource", f.name, "yaml", string(f.yaml))
		}
		return err
	}
	old := s.opts.Store.Swap(cfg)
	s.version.Store(&version)
	s.opts.Reloads.Loaded(true, s.clock.Now())
	s.opts.Metrics.setVersion(version)
	ruleset.LogWarnings(s.opts.Log, cfg) // what the peer loads but sluice finds suspect
	changes := ruleset.Diff(old, cfg)
	for _, c := range changes {
		s.opts.Log.Info("rule "+c.Kind, "rule", c.Rule, "old", c.Old, "new", c.New)
	}
	s.opts.Log.Info("rules from xDS applied", "version", version, "resources", len(resources), "rule_count", cfg.Len(), "changed", len(changes))
	if len(resources) == 0 {
		s.opts.Log.Warn("the xDS update holds no RateLimitConfig: no rules, every request is allowed", "version", version)
	}
	s.once.Do(func() { close(s.ready) })
	return nil
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
