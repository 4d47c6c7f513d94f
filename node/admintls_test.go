package main

import (
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rls/sluice/internal/logtest"
	"github.com/sluice-rls/sluice/internal/pkitest"
)

// adminGet makes GET /overrides on the admin address over TLS trusting
// roots, presenting client (none if its Certificate is empty). err is the
// TLS handshake's or the transport's.
func adminGet(t *testing.T, addr string, roots pkitest.PKI, client tls.Certificate) (int, string, error) {
	t.Helper()
	cfg := &tls.Config{RootCAs: roots.Roots, ServerName: pkitest.ServerName}
	if len(client.Certificate) > 0 {
		cfg.Certificates = []tls.Certificate{client}
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
	defer c.CloseIdleConnections()
	resp, err := c.Get("https://" + addr + "/overrides")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), nil
}

// TestAdminClientCertificatesHaveTheirOwnCA: Envoy's client certificate
// (signed by --tls-client-ca, accepted on gRPC) is refused on the admin
// address, whose clients are verified against --admin-tls-client-ca and
// --admin-tls-client-san; the operator's certificate is accepted there
// and authors /overrides calls, and is refused on gRPC.
func TestAdminClientCertificatesHaveTheirOwnCA(t *testing.T) {
	envoy := pkitest.New(t) // the server certificate, Envoy's client CA and certificate
	ops := pkitest.New(t)   // the operators' CA
	alice := ops.IssueClient(t, []string{"alice.ops.example"}, nil).Pair
	mallory := ops.IssueClient(t, []string{"mallory.example"}, nil).Pair
	s := serveInProcess(t, noEnv, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--log-format", "json",
		"--tls-cert", envoy.ServerCert, "--tls-key", envoy.ServerKey, "--tls-client-ca", envoy.CA,
		"--admin-tls-client-ca", ops.CA, "--admin-tls-client-san", "alice.ops.example")
	line := s.Serving()
	admin, grpcAddr := line["admin_addr"].(string), line["grpc_addr"].(string)

	if _, err := pkitest.ServerSerial(t, envoy.DialGRPC(t, grpcAddr, envoy.Client)); err != nil {
		t.Errorf("Envoy's certificate on gRPC: %v, want accepted", err)
	}
	if _, err := pkitest.ServerSerial(t, envoy.DialGRPC(t, grpcAddr, alice)); err == nil {
		t.Error("the operator's certificate on gRPC: accepted, want refused")
	}
	if code, body, err := adminGet(t, admin, envoy, envoy.Client); err == nil {
		t.Errorf("Envoy's certificate on the admin address: %d %s, want the TLS handshake refused", code, body)
	}
	if code, body, err := adminGet(t, admin, envoy, tls.Certificate{}); err == nil {
		t.Errorf("no certificate on the admin address: %d %s, want the TLS handshake refused", code, body)
	}
	if code, body, err := adminGet(t, admin, envoy, mallory); err == nil {
		t.Errorf("an operators' CA certificate without an accepted SAN: %d %s, want refused", code, body)
	}
	if code, body, err := adminGet(t, admin, envoy, alice); err != nil || code != http.StatusOK {
		t.Errorf("the operator's certificate on the admin address: %d %s %v, want 200", code, body, err)
	}
}

// TestAdminNeverTakesGRPCsCA: with --tls-client-ca and no
// --admin-tls-client-ca, gRPC's CA is not used on the admin address. On
// loopback it serves TLS without client certificates, /overrides is off
// (Envoy's certificate authors nothing) and a warning says so; on a
// network address serve refuses to start.
func TestAdminNeverTakesGRPCsCA(t *testing.T) {
	envoy := pkitest.New(t)
	s := serveInProcess(t, noEnv, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--log-format", "json",
		"--tls-cert", envoy.ServerCert, "--tls-key", envoy.ServerKey, "--tls-client-ca", envoy.CA)
	admin := s.Serving()["admin_addr"].(string)
	if code, body, err := adminGet(t, admin, envoy, envoy.Client); err != nil || code == http.StatusOK {
		t.Errorf("Envoy's certificate on /overrides with gRPC's CA alone: %d %s %v, want not 200", code, body, err)
	}
	if !strings.Contains(s.Log.String(), "give --admin-tls-client-ca") {
		t.Errorf("no warning that the admin address asks no client certificate:\n%s", s.Log.String())
	}
	s.StopCleanly()

	var out logtest.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := run(ctx, []string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", ":0",
		"--tls-cert", envoy.ServerCert, "--tls-key", envoy.ServerKey, "--tls-client-ca", envoy.CA}, &out, &out, noEnv)
	if err == nil || !strings.Contains(err.Error(), "needs its own --admin-tls-client-ca") {
		t.Errorf("--tls-client-ca with a network --admin-addr and no --admin-tls-client-ca: %v, want refused to start\n%s", err, out.String())
	}
}
