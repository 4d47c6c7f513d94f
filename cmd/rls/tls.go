package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluice-rls/sluice/cmd/rls/flags"
)

// serverTLSConfig returns the server TLS configuration of --tls-cert,
// --tls-key and --tls-client-ca (mTLS: clients must present a certificate
// signed by that CA), shared by the gRPC and admin listeners. None of them
// set: nil, plaintext.
func serverTLSConfig(st flags.Serve) (*tls.Config, error) {
	if st.TLSCert == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(st.TLSCert, st.TLSKey)
	if err != nil {
		return nil, fmt.Errorf("TLS: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if st.TLSClientCA != "" {
		pool, err := loadCertPool(st.TLSClientCA)
		if err != nil {
			return nil, fmt.Errorf("TLS client CA: %w", err)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// serverCredentials returns the gRPC server options for cfg (nil:
// plaintext).
func serverCredentials(cfg *tls.Config) []grpc.ServerOption {
	if cfg == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.Creds(credentials.NewTLS(cfg.Clone()))}
}

// loadCertPool reads a PEM bundle of CA certificates.
func loadCertPool(path string) (*x509.CertPool, error) {
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
