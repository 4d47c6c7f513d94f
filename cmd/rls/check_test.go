package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// stubRLS answers by domain: "over" OVER_LIMIT, "unknown" UNKNOWN, else OK.
type stubRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (stubRLS) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	code := rlsv3.RateLimitResponse_OK
	switch req.GetDomain() {
	case "over":
		code = rlsv3.RateLimitResponse_OVER_LIMIT
	case "unknown":
		code = rlsv3.RateLimitResponse_UNKNOWN
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: code}
	for range req.GetDescriptors() {
		resp.Statuses = append(resp.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{Code: code})
	}
	return resp, nil
}

// testPKI is a CA, a server certificate for "sluice" and 127.0.0.1, and a
// client certificate, as PEM files.
type testPKI struct {
	dir                            string
	ca, serverCert, serverKey      string
	clientCert, clientKey, otherCA string
	serverPair                     tls.Certificate
	caPool                         *x509.CertPool
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	p := testPKI{dir: dir}
	ca, caKey := testCA(t, "sluice test CA")
	other, _ := testCA(t, "another CA")
	p.ca = writeTestPEM(t, dir, "ca.pem", "CERTIFICATE", ca.Raw)
	p.otherCA = writeTestPEM(t, dir, "other-ca.pem", "CERTIFICATE", other.Raw)
	sc, sk := testLeaf(t, ca, caKey, "sluice", true)
	p.serverCert = writeTestPEM(t, dir, "server.pem", "CERTIFICATE", sc)
	p.serverKey = writeTestPEM(t, dir, "server-key.pem", "PRIVATE KEY", sk)
	cc, ck := testLeaf(t, ca, caKey, "envoy", false)
	p.clientCert = writeTestPEM(t, dir, "client.pem", "CERTIFICATE", cc)
	p.clientKey = writeTestPEM(t, dir, "client-key.pem", "PRIVATE KEY", ck)
	pair, err := tls.LoadX509KeyPair(p.serverCert, p.serverKey)
	if err != nil {
		t.Fatal(err)
	}
	p.serverPair = pair
	p.caPool = x509.NewCertPool()
	p.caPool.AddCert(ca)
	return p
}

func testCA(t *testing.T, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func testLeaf(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, name string, server bool) (certDER, keyDER []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{name}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	certDER, err = x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err = x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return certDER, keyDER
}

func writeTestPEM(t *testing.T, dir, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// startStubRLS serves stubRLS on 127.0.0.1 with TLS, requiring a client
// certificate signed by the PKI's CA.
func startStubRLS(t *testing.T, p testPKI) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{p.serverPair},
		ClientCAs:    p.caPool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	})))
	rlsv3.RegisterRateLimitServiceServer(s, stubRLS{})
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

func TestCheckExitCodesAndTLS(t *testing.T) {
	p := newTestPKI(t)
	addr := startStubRLS(t, p)
	mtls := []string{"--addr", addr, "--tls-ca", p.ca, "--tls-cert", p.clientCert, "--tls-key", p.clientKey}
	tests := []struct {
		name     string
		args     []string
		exit     int
		stdout   string // a line the output must start with
		inOutput string // in stderr or the error
	}{
		{"OK over mTLS", append(withArgs(mtls), "--domain", "edge", "user_id=a"), 0, "OK", ""},
		{"OVER_LIMIT", append(withArgs(mtls), "--domain", "over", "user_id=a"), 1, "OVER_LIMIT", ""},
		{"answer neither OK nor OVER_LIMIT", append(withArgs(mtls), "--domain", "unknown", "user_id=a"), 2, "UNKNOWN", "neither OK nor OVER_LIMIT"},
		{"server name given", append(withArgs(mtls), "--tls-server-name", "sluice", "user_id=a"), 0, "OK", ""},
		{"server name not in the certificate", append(withArgs(mtls), "--tls-server-name", "elsewhere", "user_id=a"), 2, "", "elsewhere"},
		{"server signed by another CA", []string{"--addr", addr, "--tls-ca", p.otherCA, "--tls-cert", p.clientCert, "--tls-key", p.clientKey, "user_id=a"}, 2, "", "certificate"},
		{"no client certificate", []string{"--addr", addr, "--tls-ca", p.ca, "user_id=a"}, 2, "", "ShouldRateLimit"},
		{"plaintext to a TLS server", []string{"--addr", addr, "user_id=a"}, 2, "", "ShouldRateLimit"},
		{"CA file is not PEM", []string{"--addr", addr, "--tls-ca", p.clientKey, "user_id=a"}, 2, "", "no PEM certificates"},
		{"cert without key", []string{"--addr", addr, "--tls-ca", p.ca, "--tls-cert", p.clientCert, "user_id=a"}, 2, "", "go together"},
		{"server name without TLS", []string{"--addr", addr, "--tls-server-name", "sluice", "user_id=a"}, 2, "", "needs --tls-ca"},
		{"bad descriptor", append(withArgs(mtls), "novalue"), 2, "", "want KEY=VALUE"},
		{"no descriptor", withArgs(mtls), 2, "", "usage: rls check"},
		{"unknown flag", []string{"--no-such-flag"}, 2, "", "no-such-flag"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), append([]string{"check", "--timeout", "10s"}, tt.args...), &stdout, &stderr, noEnv)
			exit := 0
			if err != nil {
				exit = exitCode(err)
			}
			if exit != tt.exit {
				t.Errorf("exit %d (err %v), want %d; stdout %q, stderr %q", exit, err, tt.exit, stdout.String(), stderr.String())
			}
			if !strings.HasPrefix(stdout.String(), tt.stdout) {
				t.Errorf("stdout %q, want it to start with %q", stdout.String(), tt.stdout)
			}
			got := stderr.String()
			if err != nil {
				got += err.Error()
			}
			if !strings.Contains(got, tt.inOutput) {
				t.Errorf("stderr and error %q lack %q", got, tt.inOutput)
			}
		})
	}
}

// withArgs copies args, so that appends to it do not share a backing array.
func withArgs(args []string) []string { return append([]string(nil), args...) }
