package node

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// serverTLS is the server side of one listener's TLS: --tls-cert and
// --tls-key, and the client CA and SAN list it requires certificates of
// (mTLS). gRPC's are --tls-client-ca and --tls-client-san (Envoy); the
// admin listener's are its own, --admin-tls-client-ca and
// --admin-tls-client-san (operators), so that Envoy's certificate is never
// an operator's. The files are read again when they change (certFiles).
type serverTLS struct {
	files       *certFiles
	clientCerts bool     // require client certificates of files' CA bundle
	sans        []string // empty: any certificate the CA signed
	sanFlag     string   // the flag of sans, for errors
	log         *slog.Logger
}

// newServerTLS reads the server's TLS files; nil, nil when --tls-cert is
// not set (plaintext).
func newServerTLS(st Options, clock clockwork.Clock, log *slog.Logger, reg prometheus.Registerer) (*serverTLS, error) {
	if st.TLSCert == "" {
		return nil, nil
	}
	files, err := newCertFiles(certFilesOptions{
		Name: "grpc", Cert: st.TLSCert, Key: st.TLSKey, CA: st.TLSClientCA, Clock: clock, Log: log, Reg: reg,
	})
	if err != nil {
		return nil, fmt.Errorf("TLS: %w", err)
	}
	return &serverTLS{files: files, clientCerts: st.TLSClientCA != "", sans: splitList(st.TLSClientSAN), sanFlag: "--tls-client-san", log: log}, nil
}

// newAdminTLS returns the admin listener's TLS (nil without --tls-cert):
// the server certificate of grpc, and client certificates of
// --admin-tls-client-ca (with --admin-tls-client-san), read and reloaded
// on their own (ratelimit_tls_* certificate="admin"). Without
// --admin-tls-client-ca the admin listener asks for no client certificate:
// gRPC's --tls-client-ca is never used there.
func newAdminTLS(st Options, grpcTLS *serverTLS, clock clockwork.Clock, log *slog.Logger, reg prometheus.Registerer) (*serverTLS, error) {
	if grpcTLS == nil {
		return nil, nil
	}
	if st.AdminTLSClientCA == "" {
		return &serverTLS{files: grpcTLS.files, log: log}, nil
	}
	files, err := newCertFiles(certFilesOptions{
		Name: "admin", Cert: st.TLSCert, Key: st.TLSKey, CA: st.AdminTLSClientCA, Clock: clock, Log: log, Reg: reg,
	})
	if err != nil {
		return nil, fmt.Errorf("admin TLS: %w", err)
	}
	return &serverTLS{files: files, clientCerts: true, sans: splitList(st.AdminTLSClientSAN), sanFlag: "--admin-tls-client-san", log: log}, nil
}

// errAdminNeedsOwnCA refuses to serve a network-reachable admin address
// while gRPC requires client certificates and the admin address has no CA
// of its own: it used to take gRPC's, which made Envoy an operator, and
// serving it without client certificates would open it silently.
var errAdminNeedsOwnCA = errors.New("--tls-client-ca verifies the gRPC port's clients (Envoy) only; the admin address is reachable from the network and needs its own --admin-tls-client-ca (the operators' CA): give it, bind --admin-addr to loopback, or turn the admin address off with --admin-addr ''")

// checkAdminAddr refuses the admin listener at addr with
// errAdminNeedsOwnCA, and warns when it asks no client certificate where
// --tls-client-ca may make an operator believe it does, or where the
// network reaches it.
func checkAdminAddr(st Options, addr net.Addr, log *slog.Logger) error {
	ownCA := st.AdminTLSClientCA != ""
	if st.TLSClientCA != "" && !ownCA && !isLoopback(addr) {
		return fmt.Errorf("admin listener %s: %w", addr, errAdminNeedsOwnCA)
	}
	if !isLoopback(addr) && !ownCA {
		log.Warn("the admin address is reachable from the network without client certificates: anyone who reaches it can spend tokens through /json",
			"admin_addr", addr.String())
	}
	if st.TLSClientCA != "" && !ownCA {
		log.Warn("the admin address (loopback) asks no client certificate: --tls-client-ca verifies Envoy on the gRPC port only; give --admin-tls-client-ca for operators' certificates",
			"admin_addr", addr.String())
	}
	return nil
}

// config returns a listener's TLS configuration: each handshake gets the
// certificate and client CA in use at that moment, offering nextProtos by
// ALPN (gRPC adds h2 itself).
func (s *serverTLS) config(nextProtos ...string) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := s.files.get()
			cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{m.pair}, NextProtos: nextProtos}
			if s.clientCerts && m.pool != nil {
				cfg.ClientCAs = m.pool
				cfg.ClientAuth = tls.RequireAndVerifyClientCert
				if len(s.sans) > 0 {
					cfg.VerifyConnection = s.checkSAN
				}
			}
			return cfg, nil
		},
	}
}

// checkSAN refuses a client certificate (already verified against the
// client CA) that carries none of s.sans: see clientSANMatches.
func (s *serverTLS) checkSAN(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) > 0 && clientSANMatches(cs.PeerCertificates[0], s.sans) {
		return nil
	}
	if len(cs.PeerCertificates) > 0 {
		leaf := cs.PeerCertificates[0]
		s.log.Debug("TLS client refused: no accepted SAN", "certificate", s.files.name, "subject", leaf.Subject.String(),
			"dns_sans", leaf.DNSNames, "uri_sans", fmt.Sprint(leaf.URIs))
	}
	return fmt.Errorf("client certificate carries none of the names %s accepts", s.sanFlag)
}

// clientSANMatches reports whether leaf carries one of sans. A name with
// "://" (a SPIFFE ID such as spiffe://cluster.local/ns/edge/sa/envoy) must
// equal one of the URI SANs. Any other name is checked as
// envoyproxy/ratelimit checks its GRPC_CLIENT_TLS_SAN, with x509's host
// name rules: it matches a DNS SAN (case-insensitive; a wildcard SAN
// *.example.com covers one label), or, when it is an IP address, an IP SAN.
// The subject's common name is never used.
func clientSANMatches(leaf *x509.Certificate, sans []string) bool {
	for _, want := range sans {
		if strings.Contains(want, "://") {
			if slices.ContainsFunc(leaf.URIs, func(u *url.URL) bool { return u.String() == want }) {
				return true
			}
			continue
		}
		if leaf.VerifyHostname(want) == nil {
			return true
		}
	}
	return false
}

// splitList splits a comma-separated flag value, dropping blanks.
func splitList(s string) []string {
	var out []string
	for part := range strings.SplitSeq(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// serverCredentials returns the gRPC server options for s (nil: plaintext).
func serverCredentials(s *serverTLS) []grpc.ServerOption {
	if c := transportCredentials(s); c != nil {
		return []grpc.ServerOption{grpc.Creds(c)}
	}
	return nil
}

// transportCredentials returns gRPC's credentials for s (nil: plaintext).
func transportCredentials(s *serverTLS) credentials.TransportCredentials {
	if s == nil {
		return nil
	}
	return credentials.NewTLS(s.config())
}

// useRedisClientCert makes a TLS Redis connection present the key pair of
// --redis-tls-cert and --redis-tls-key (Redis' tls-auth-clients). The files
// are read again when they change, for the connections opened after.
func useRedisClientCert(opts *goredis.UniversalOptions, st Options, clock clockwork.Clock, log *slog.Logger, reg prometheus.Registerer) error {
	if opts.TLSConfig == nil {
		return fmt.Errorf("--redis-tls-cert needs a TLS URL (rediss:// or sentinels://)")
	}
	files, err := newCertFiles(certFilesOptions{
		Name: "redis", Cert: st.RedisTLSCert, Key: st.RedisTLSKey, Clock: clock, Log: log, Reg: reg,
	})
	if err != nil {
		return fmt.Errorf("--redis-tls-cert, --redis-tls-key: %w", err)
	}
	opts.TLSConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return &files.get().pair, nil
	}
	return nil
}

// LoadCertPool reads a PEM bundle of CA certificates.
func LoadCertPool(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificates", path)
	}
	return pool, nil
}
