package flags

import (
	"flag"
	"fmt"
	"time"

	"github.com/sluice-rls/sluice/xds"
)

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
}

func (x *XDS) register(fs *flag.FlagSet) {
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
}

// validate checks the xDS flags; config is --config, which xDS excludes.
func (x XDS) validate(config string) error {
	if x.Server == "" {
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
