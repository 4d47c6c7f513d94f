package node

import (
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

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
	opts := testOptions()
	opts.AdminAddr = "127.0.0.1:0"
	opts.TLSCert, opts.TLSKey, opts.TLSClientCA = envoy.ServerCert, envoy.ServerKey, envoy.CA
	opts.AdminTLSClientCA, opts.AdminTLSClientSAN = ops.CA, "alice.ops.example"
	a := start(t, opts).Addrs()
	admin, grpcAddr := a.Admin.String(), a.GRPC.String()

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

// TestAdminNeverTakesGRPCsCA: with TLSClientCA (--tls-client-ca) and no
// AdminTLSClientCA, gRPC's CA is not used on the admin address. On
// loopback it serves TLS without client certificates, /overrides is off
// (Envoy's certificate authors nothing) and a warning says so; on a
// network address the node refuses to start.
func TestAdminNeverTakesGRPCsCA(t *testing.T) {
	envoy := pkitest.New(t)
	opts := testOptions()
	opts.AdminAddr = "127.0.0.1:0"
	opts.TLSCert, opts.TLSKey, opts.TLSClientCA = envoy.ServerCert, envoy.ServerKey, envoy.CA
	s := start(t, opts)
	admin := s.Addrs().Admin.String()
	if code, body, err := adminGet(t, admin, envoy, envoy.Client); err != nil || code == http.StatusOK {
		t.Errorf("Envoy's certificate on /overrides with gRPC's CA alone: %d %s %v, want not 200", code, body, err)
	}
	if !strings.Contains(s.Log.String(), "give --admin-tls-client-ca") {
		t.Errorf("no warning that the admin address asks no client certificate:\n%s", s.Log.String())
	}
	s.StopCleanly()

	opts.AdminAddr = ":0"
	if err := runErr(t, opts); err == nil || !strings.Contains(err.Error(), "needs its own --admin-tls-client-ca") {
		t.Errorf("TLSClientCA with a network AdminAddr and no AdminTLSClientCA: %v, want refused to start", err)
	}
}
