//go:build integration

package integration

import (
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
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

func TestMetricsScrape(t *testing.T) {
	p := startRLS(t)
	// Counts that timing cannot change: 20 requests inside user_id's burst
	// of 20, and 5 for the blocked address (0 per second).
	for range 20 {
		p.Check(t, "edge", "user_id=scrape")
	}
	for range 5 {
		p.Check(t, "edge", "remote_address=50.0.0.5")
	}
	p.Check(t, "nope", "a=b")
	_, body := p.HTTPGet(t, "/metrics")
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	types := map[string]dto.MetricType{
		"ratelimit_requests_total":                        dto.MetricType_COUNTER,
		"ratelimit_decisions_total":                       dto.MetricType_COUNTER,
		"ratelimit_request_duration_seconds":              dto.MetricType_HISTOGRAM,
		"ratelimit_unknown_domain_requests_total":         dto.MetricType_COUNTER,
		"ratelimit_config_loads_total":                    dto.MetricType_COUNTER,
		"ratelimit_config_last_success_timestamp_seconds": dto.MetricType_GAUGE,
		"ratelimit_memory_buckets":                        dto.MetricType_GAUGE,
	}
	for name, want := range types {
		f, ok := families[name]
		if !ok {
			t.Errorf("/metrics lacks %s", name)
			continue
		}
		if f.GetType() != want {
			t.Errorf("%s has type %v, want %v", name, f.GetType(), want)
		}
	}
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"ratelimit_requests_total", map[string]string{"domain": "edge", "code": "ok"}, 20},
		{"ratelimit_requests_total", map[string]string{"domain": "edge", "code": "over_limit"}, 5},
		{"ratelimit_decisions_total", map[string]string{"rule": "edge.user_id", "layer": "global"}, 20},
		{"ratelimit_decisions_total", map[string]string{"rule": "edge.remote_address_50.0.0.5", "layer": "global", "result": "over_limit"}, 5},
		{"ratelimit_unknown_domain_requests_total", nil, 1},
		{"ratelimit_config_loads_total", map[string]string{"result": "success"}, 1},
	}
	for _, c := range checks {
		if got := sumSeries(families[c.name], c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if n := sumHistogramCount(families["ratelimit_request_duration_seconds"]); n != 26 {
		t.Errorf("duration histogram counted %d requests, want 26 (every answered request)", n)
	}
	if ts := sumSeries(families["ratelimit_config_last_success_timestamp_seconds"], nil); time.Since(time.Unix(int64(ts), 0)) > time.Minute {
		t.Errorf("last success timestamp %v is not recent", ts)
	}
}

func sumSeries(f *dto.MetricFamily, labels map[string]string) float64 {
	total := 0.0
series:
	for _, m := range f.GetMetric() {
		for _, lp := range m.GetLabel() {
			if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
				continue series
			}
		}
		total += m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	return total
}

func sumHistogramCount(f *dto.MetricFamily) uint64 {
	var n uint64
	for _, m := range f.GetMetric() {
		n += m.GetHistogram().GetSampleCount()
	}
	return n
}

func TestReloadThroughTheBinary(t *testing.T) {
	dir := t.TempDir()
	rules := func(n string) string {
		return "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: " + n + "}\n"
	}
	file := writeFile(t, dir, "rules.yaml", rules("2"))
	p := startRLS(t, "--config", dir)
	limit := func() uint32 {
		return p.Check(t, "r", "k=x").GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
	}
	if got := limit(); got != 2 {
		t.Fatalf("initial limit %d, want 2", got)
	}
	// A broken file keeps the running rules and is logged with file:line.
	writeFile(t, dir, "rules.yaml", "domain: r\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n")
	waitForLog(t, p, "rules.yaml:4:")
	if got := limit(); got != 2 {
		t.Errorf("after a bad file the limit is %d, want 2", got)
	}
	// A good file reloads by itself (fsnotify) …
	writeFile(t, dir, "rules.yaml", rules("7"))
	pollUntil(t, "the file change to reload", func() bool { return limit() == 7 })
	// … and on SIGHUP.
	if err := os.WriteFile(file, []byte(rules("9")), 0o644); err != nil {
		t.Fatal(err)
	}
	p.Signal(t, syscall.SIGHUP)
	pollUntil(t, "SIGHUP to reload", func() bool { return limit() == 9 })
	if !strings.Contains(p.Log(), "rule changed") {
		t.Errorf("log lacks the old → new line:\n%s", p.Log())
	}
}

// mTLS is a test PKI: a CA, a server certificate for "sluice" and a client
// certificate, the first two written to files for rls' TLS flags.
type mTLS struct {
	flags  []string // --tls-cert, --tls-key, --tls-client-ca and their files
	roots  *x509.CertPool
	client tls.Certificate
}

// newMTLS writes a PKI to a temporary directory.
func newMTLS(t *testing.T) mTLS {
	t.Helper()
	dir := t.TempDir()
	ca, caKey := newCA(t)
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", ca.Raw)
	serverCert, serverKey := newLeaf(t, ca, caKey, "sluice", true)
	writePEM(t, filepath.Join(dir, "server.pem"), "CERTIFICATE", serverCert)
	writePEM(t, filepath.Join(dir, "server-key.pem"), "PRIVATE KEY", serverKey)
	clientCert, clientKey := newLeaf(t, ca, caKey, "envoy", false)
	pair, err := tls.X509KeyPair(pemBytes("CERTIFICATE", clientCert), pemBytes("PRIVATE KEY", clientKey))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	return mTLS{
		flags: []string{"--tls-cert", filepath.Join(dir, "server.pem"), "--tls-key", filepath.Join(dir, "server-key.pem"),
			"--tls-client-ca", filepath.Join(dir, "ca.pem")},
		roots:  roots,
		client: pair,
	}
}

func TestMutualTLS(t *testing.T) {
	m := newMTLS(t)
	p := startRLS(t, m.flags...)
	roots := m.roots
	call := func(certs []tls.Certificate) error {
		creds := credentials.NewTLS(&tls.Config{RootCAs: roots, Certificates: certs, ServerName: "sluice"})
		conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(creds))
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, request("edge", "user_id=tls"))
		return err
	}
	if err := call([]tls.Certificate{m.client}); err != nil {
		t.Errorf("client with a valid certificate: %v", err)
	}
	if err := call(nil); err == nil {
		t.Errorf("client without a certificate was served")
	}
	// Plaintext is refused too.
	if _, err := p.Client.ShouldRateLimit(context.Background(), request("edge", "user_id=tls")); err == nil {
		t.Errorf("plaintext client was served")
	}
}

func newCA(t *testing.T) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "sluice test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
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

// newLeaf returns a DER certificate and PKCS#8 key signed by ca.
func newLeaf(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, name string, server bool) ([]byte, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{name}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return der, keyDER
}

func pemBytes(kind string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
}

func writePEM(t *testing.T, path, kind string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pemBytes(kind, der), 0o600); err != nil {
		t.Fatal(err)
	}
}

// pollUntil polls cond with a deadline.
func pollUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitForLog(t *testing.T, p *rlsProcess, substr string) {
	t.Helper()
	pollUntil(t, "log line "+substr, func() bool { return strings.Contains(p.Log(), substr) })
}

func TestPprofBehindFlag(t *testing.T) {
	off := startRLS(t)
	if code, _ := off.AdminGet(t, "/debug/pprof/"); code != 404 {
		t.Errorf("/debug/pprof/ without --pprof: %d, want 404", code)
	}
	on := startRLS(t, "--pprof")
	if code, body := on.AdminGet(t, "/debug/pprof/"); code != 200 || !strings.Contains(body, "goroutine") {
		t.Errorf("/debug/pprof/ with --pprof: %d", code)
	}
	// Only on the admin address, not on the HTTP one.
	if code, _ := on.HTTPGet(t, "/debug/pprof/"); code != 404 {
		t.Errorf("/debug/pprof/ on --http-addr: %d, want 404", code)
	}
}
