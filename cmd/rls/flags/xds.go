package flags

import (
	"flag"

	"github.com/sluice-rls/sluice/node"
	"github.com/sluice-rls/sluice/xds"
)

// registerXDS registers the flags of XDS onto x.
func registerXDS(fs *flag.FlagSet, x *node.XDS) {
	fs.StringVar(&x.Server, "xds-server", "", "xDS management server host:port to take the rules from (RateLimitConfig over ADS, as Envoy Gateway serves them) instead of --config")
	fs.StringVar(&x.NodeID, "xds-node-id", xds.DefaultNodeID, "node id sent to the xDS management server, which keys its snapshots by it (Envoy Gateway: envoy-ratelimit)")
	fs.StringVar(&x.NodeCluster, "xds-node-cluster", "", "node cluster sent to the xDS management server (optional)")
	fs.StringVar(&x.TLSCA, "xds-tls-ca", "", "CA bundle (PEM) to verify the xDS management server's certificate; enables TLS")
	fs.StringVar(&x.TLSCert, "xds-tls-cert", "", "client certificate (PEM) presented to the xDS management server (mTLS); needs --xds-tls-ca")
	fs.StringVar(&x.TLSKey, "xds-tls-key", "", "client private key (PEM) of --xds-tls-cert")
	fs.StringVar(&x.TLSServerName, "xds-tls-server-name", "", "name the xDS management server's certificate must carry (default: the host of --xds-server)")
	fs.DurationVar(&x.BackoffMin, "xds-backoff-min", xds.DefaultBackoffMin, "first wait before reconnecting to the xDS management server; doubles per failed attempt, jittered to half to all of it")
	fs.DurationVar(&x.BackoffMax, "xds-backoff-max", xds.DefaultBackoffMax, "longest wait before reconnecting to the xDS management server or repeating a NACK; a stream open this long resets the backoff")
	fs.IntVar(&x.MaxResources, "xds-max-resources", xds.DefaultMaxResources, "most RateLimitConfig resources (domains) one xDS update may hold; a larger update is NACKed")
	fs.IntVar(&x.MaxDescriptors, "xds-max-descriptors", xds.DefaultMaxDescriptors, "most descriptors one xDS update may hold, every level of every resource; a larger update is NACKed")
	fs.IntVar(&x.MaxDepth, "xds-max-depth", xds.DefaultMaxDepth, "most levels descriptors of an xDS resource may nest (rule files: 64); a deeper update is NACKed")
	fs.BoolVar(&x.ReadyBeforeRules, "xds-ready-before-rules", false, "report ready (/healthcheck, gRPC health) before the first xDS update, answering OK to every request meanwhile, as envoyproxy/ratelimit with FORCE_START_WITHOUT_INITIAL_CONFIG=true (default: not ready until the first update)")
}
