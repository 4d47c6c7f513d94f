package node

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"math"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/ruleset"
	"github.com/sluice-rls/sluice/xds"
)

// initialRules are the rules serve starts with: --config (or the embedded
// example) loaded from files, or, with --xds-server, none until the first
// xDS update: every request is allowed meanwhile (as envoyproxy/ratelimit
// with FORCE_START_WITHOUT_INITIAL_CONFIG, which Envoy Gateway sets), and
// /healthcheck and gRPC health say not ready (gateHealth).
func initialRules(st Options) (*descriptors.Config, error) {
	if st.XDS.Server != "" {
		return descriptors.New(nil, st.Rules.descriptorOptions())
	}
	var paths []string // none: the embedded example
	if st.Config != "" {
		paths = []string{st.Config}
	}
	return st.Rules.Load(paths...)
}

// rulesName names where the rules come from in the "serving" log line.
func rulesName(st Options) string {
	if st.XDS.Server != "" {
		return "xds://" + st.XDS.Server
	}
	return cmp.Or(st.Config, ruleset.DefaultRulesName)
}

// startXDS runs the xDS source of --xds-server into store until ctx is
// done; stop cancels it and waits for it to end.
func startXDS(ctx context.Context, st Options, store *ruleset.Store, log *slog.Logger, reg prometheus.Registerer, reloads *ruleset.ReloadMetrics, trail auditTrail) (src *xds.Source, stop func(), err error) {
	creds, err := xdsCredentials(st.XDS)
	if err != nil {
		return nil, nil, err
	}
	src, err = xds.New(xds.Options{
		Server:      st.XDS.Server,
		NodeID:      st.XDS.NodeID,
		NodeCluster: st.XDS.NodeCluster,
		DialOptions: []grpc.DialOption{
			grpc.WithTransportCredentials(creds),
			// An update is a rule set: --max-rule-bytes bounds it as it
			// bounds rule files (gRPC's default would be 4 MiB).
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(int(min(st.MaxRuleBytes, math.MaxInt32)))),
		},
		Store:       store,
		RuleOptions: st.Rules.descriptorOptions(),
		Log:         log,
		Reloads:     reloads,
		Audit:       trail.rec,
		AuditNode:   trail.node,
		Metrics:     xds.NewMetrics(reg),
		BackoffMin:  st.XDS.BackoffMin,
		BackoffMax:  st.XDS.BackoffMax,
		Limits: xds.Limits{
			MaxBytes:       st.MaxRuleBytes,
			MaxResources:   st.XDS.MaxResources,
			MaxDescriptors: st.XDS.MaxDescriptors,
			MaxDepth:       st.XDS.MaxDepth,
		},
	})
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = src.Run(ctx) // returns nil when ctx is done
	}()
	return src, func() { cancel(); <-done }, nil
}

// xdsCredentials are the transport credentials to the management server:
// TLS when --xds-tls-ca is set (with a client certificate when
// --xds-tls-cert is), plaintext otherwise.
func xdsCredentials(x XDS) (credentials.TransportCredentials, error) {
	if x.TLSCA == "" {
		return insecure.NewCredentials(), nil
	}
	pool, err := LoadCertPool(x.TLSCA)
	if err != nil {
		return nil, fmt.Errorf("xDS TLS CA: %w", err)
	}
	cfg := &tls.Config{RootCAs: pool, ServerName: x.TLSServerName, MinVersion: tls.VersionTLS12}
	if x.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(x.TLSCert, x.TLSKey)
		if err != nil {
			return nil, fmt.Errorf("xDS TLS client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return credentials.NewTLS(cfg), nil
}

// gateHealth keeps gRPC health NOT_SERVING until src applies its first
// update. After the drain's Shutdown the health server ignores the switch.
func gateHealth(ctx context.Context, hs *health.Server, src *xds.Source) {
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	hs.SetServingStatus(healthServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	go func() {
		select {
		case <-ctx.Done():
		case <-src.Ready():
			hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
			hs.SetServingStatus(healthServiceName, healthpb.HealthCheckResponse_SERVING)
		}
	}()
}

// xdsWaiting is why /healthcheck answers 503 while src (nil: rules from
// files) has applied no update yet, or "" once it has.
func xdsWaiting(src *xds.Source, server string) string {
	if src == nil {
		return ""
	}
	if _, ok := src.Version(); ok {
		return ""
	}
	return "waiting for the first rules from the xDS server " + server
}
