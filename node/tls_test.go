package node

import (
	"crypto/tls"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-rls/sluice/internal/logtest"
	"github.com/sluice-rls/sluice/internal/pkitest"
)

// secretVolume lays out TLS files as the kubelet does for a Secret volume:
// dir/tls.crt → ..data/tls.crt, ..data → ..<version>/, so that an update
// swaps the ..data symlink in one rename.
type secretVolume struct {
	t       *testing.T
	dir     string
	version int
}

func newSecretVolume(t *testing.T) *secretVolume {
	v := &secretVolume{t: t, dir: t.TempDir()}
	for _, name := range []string{"tls.crt", "tls.key", "ca.crt"} {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(v.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return v
}

func (v *secretVolume) path(name string) string { return filepath.Join(v.dir, name) }

// publish writes a new version holding the PEM files cert, key and ca and
// swaps ..data to it.
func (v *secretVolume) publish(cert, key, ca string) {
	t := v.t
	t.Helper()
	v.version++
	ver := "..v" + string(rune('0'+v.version))
	if err := os.Mkdir(filepath.Join(v.dir, ver), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, src := range map[string]string{"tls.crt": cert, "tls.key": key, "ca.crt": ca} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(v.dir, ver, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(v.dir, "..data_tmp")
	if err := os.Symlink(ver, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

// tlsServer runs a gRPC server (health service only) with s's credentials
// on 127.0.0.1:0 and returns its address.
func tlsServer(t *testing.T, s *serverTLS) string {
	t.Helper()
	srv := grpc.NewServer(serverCredentials(s)...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return lis.Addr().String()
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestServerTLSReloadsOnChange rotates the server certificate in a Secret
// volume layout: new connections get the new certificate once the check
// interval has passed, the open connection keeps its own, and a pair that
// does not match keeps the running certificate and is counted.
func TestServerTLSReloadsOnChange(t *testing.T) {
	p := pkitest.New(t)
	vol := newSecretVolume(t)
	first := p.IssueServer(t, t.TempDir())
	vol.publish(first.Cert, first.Key, p.CA)
	clock := clockwork.NewFakeClock()
	reg := prometheus.NewRegistry()
	st := Options{TLSCert: vol.path("tls.crt"), TLSKey: vol.path("tls.key"), TLSClientCA: vol.path("ca.crt")}
	s, err := newServerTLS(st, clock, discardLogger(), reg)
	if err != nil {
		t.Fatal(err)
	}
	addr := tlsServer(t, s)
	serial := func(conn *grpc.ClientConn) *big.Int {
		t.Helper()
		n, err := pkitest.ServerSerial(t, conn)
		if err != nil {
			t.Fatalf("health check over TLS: %v", err)
		}
		return n
	}

	old := p.DialGRPC(t, addr, p.Client)
	if got, want := serial(old), first.Pair.Leaf.SerialNumber; got.Cmp(want) != 0 {
		t.Fatalf("first connection: serial %v, want %v", got, want)
	}

	second := p.IssueServer(t, t.TempDir())
	vol.publish(second.Cert, second.Key, p.CA)
	if got := serial(p.DialGRPC(t, addr, p.Client)); got.Cmp(first.Pair.Leaf.SerialNumber) != 0 {
		t.Errorf("new connection within %v of the last look: serial %v, want the first %v", certCheckEvery, got, first.Pair.Leaf.SerialNumber)
	}
	clock.Advance(certCheckEvery)
	if got := serial(p.DialGRPC(t, addr, p.Client)); got.Cmp(second.Pair.Leaf.SerialNumber) != 0 {
		t.Errorf("new connection after the rotation: serial %v, want the second %v", got, second.Pair.Leaf.SerialNumber)
	}
	if got := serial(old); got.Cmp(first.Pair.Leaf.SerialNumber) != 0 {
		t.Errorf("connection opened before the rotation: serial %v, want still the first %v", got, first.Pair.Leaf.SerialNumber)
	}

	// A certificate whose key is not the one published with it.
	third := p.IssueServer(t, t.TempDir())
	vol.publish(third.Cert, second.Key, p.CA)
	clock.Advance(certCheckEvery)
	if got := serial(p.DialGRPC(t, addr, p.Client)); got.Cmp(second.Pair.Leaf.SerialNumber) != 0 {
		t.Errorf("after a mismatched pair: serial %v, want the running second %v", got, second.Pair.Leaf.SerialNumber)
	}
	clock.Advance(certCheckEvery)
	_ = serial(p.DialGRPC(t, addr, p.Client)) // the same bad files: not counted again
	if got := loadsCounted(t, reg, "error"); got != 1 {
		t.Errorf("ratelimit_tls_loads_total{result=error} = %v, want 1", got)
	}
	if got := loadsCounted(t, reg, "success"); got != 2 {
		t.Errorf("ratelimit_tls_loads_total{result=success} = %v, want 2 (start, rotation)", got)
	}
	if got, want := gaugeValue(t, reg, "ratelimit_tls_cert_expiry_timestamp_seconds", ""), float64(second.Pair.Leaf.NotAfter.Unix()); got != want {
		t.Errorf("ratelimit_tls_cert_expiry_timestamp_seconds = %v, want %v", got, want)
	}

	// Fixed: the good pair is taken.
	vol.publish(third.Cert, third.Key, p.CA)
	clock.Advance(certCheckEvery)
	if got := serial(p.DialGRPC(t, addr, p.Client)); got.Cmp(third.Pair.Leaf.SerialNumber) != 0 {
		t.Errorf("after the fix: serial %v, want the third %v", got, third.Pair.Leaf.SerialNumber)
	}
}

// loadsCounted returns ratelimit_tls_loads_total{result=result} in reg.
func loadsCounted(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "ratelimit_tls_loads_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no ratelimit_tls_loads_total{result=%q}", result)
	return 0
}

// TestServerTLSNewClientCA: a rotated client CA takes effect for new
// connections too.
func TestServerTLSNewClientCA(t *testing.T) {
	p, q := pkitest.New(t), pkitest.New(t)
	vol := newSecretVolume(t)
	vol.publish(p.ServerCert, p.ServerKey, p.CA)
	clock := clockwork.NewFakeClock()
	st := Options{TLSCert: vol.path("tls.crt"), TLSKey: vol.path("tls.key"), TLSClientCA: vol.path("ca.crt")}
	s, err := newServerTLS(st, clock, discardLogger(), prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	addr := tlsServer(t, s)
	if _, err := pkitest.ServerSerial(t, p.DialGRPC(t, addr, q.Client)); err == nil {
		t.Fatal("a client of another CA was accepted")
	}
	vol.publish(p.ServerCert, p.ServerKey, q.CA) // trust q's clients now
	clock.Advance(certCheckEvery)
	if _, err := pkitest.ServerSerial(t, p.DialGRPC(t, addr, q.Client)); err != nil {
		t.Errorf("client of the new CA after the CA rotation: %v", err)
	}
	if _, err := pkitest.ServerSerial(t, p.DialGRPC(t, addr, p.Client)); err == nil {
		t.Error("client of the old CA still accepted after the CA rotation")
	}
}

// TestClientSAN: with --tls-client-san, a client certificate must carry one
// of the names; the CA's signature alone no longer suffices.
func TestClientSAN(t *testing.T) {
	p := pkitest.New(t)
	st := Options{TLSCert: p.ServerCert, TLSKey: p.ServerKey, TLSClientCA: p.CA,
		TLSClientSAN: "envoy.edge.svc.cluster.local, spiffe://cluster.local/ns/edge/sa/envoy,10.0.0.7"}
	var logs logtest.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s, err := newServerTLS(st, clockwork.NewFakeClock(), log, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	addr := tlsServer(t, s)
	tests := []struct {
		name   string
		cert   tls.Certificate
		wantOK bool
	}{
		{"DNS SAN listed", p.IssueClient(t, []string{"other.example", "envoy.edge.svc.cluster.local"}, nil).Pair, true},
		{"DNS SAN in another case", p.IssueClient(t, []string{"Envoy.Edge.svc.cluster.local"}, nil).Pair, true},
		{"wildcard DNS SAN", p.IssueClient(t, []string{"*.edge.svc.cluster.local"}, nil).Pair, true},
		{"URI SAN listed", p.IssueClient(t, nil, []string{"spiffe://cluster.local/ns/edge/sa/envoy"}).Pair, true},
		{"other DNS SAN", p.IssueClient(t, []string{"attacker.edge.svc.cluster.local.evil"}, nil).Pair, false},
		{"other URI SAN", p.IssueClient(t, nil, []string{"spiffe://cluster.local/ns/edge/sa/other"}).Pair, false},
		{"name as URI is not a DNS SAN", p.IssueClient(t, nil, []string{"dns://envoy.edge.svc.cluster.local"}).Pair, false},
		{"common name only", p.Client, false},
		{"no certificate", tls.Certificate{}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := pkitest.ServerSerial(t, p.DialGRPC(t, addr, tt.cert))
			if (err == nil) != tt.wantOK {
				t.Errorf("call with %s: error %v, want accepted %v", tt.name, err, tt.wantOK)
			}
		})
	}
	if !strings.Contains(logs.String(), "TLS client refused: no accepted SAN") || !strings.Contains(logs.String(), "attacker.edge.svc.cluster.local.evil") {
		t.Errorf("debug log does not name the refused certificate's SANs:\n%s", logs.String())
	}
}

func TestClientSANMatchesIP(t *testing.T) {
	p := pkitest.New(t)
	// The server certificate carries the IP SAN 127.0.0.1.
	if !clientSANMatches(p.Server.Leaf, []string{"10.0.0.1", "127.0.0.1"}) {
		t.Error("IP SAN 127.0.0.1 not matched by the name 127.0.0.1")
	}
	if clientSANMatches(p.Server.Leaf, []string{"127.0.0.2", "sluice.example"}) {
		t.Error("matched names the certificate does not carry")
	}
}

// TestServerTLSOptionsErrors: TLS options that do not go together are
// refused by New, and files that do not fit each other by Run, naming
// the flags.
func TestServerTLSOptionsErrors(t *testing.T) {
	p := pkitest.New(t)
	tests := []struct {
		name string
		set  func(*Options)
		want string
	}{
		{"SAN without client CA", func(o *Options) {
			o.TLSCert, o.TLSKey, o.TLSClientSAN = p.ServerCert, p.ServerKey, "envoy"
		}, "--tls-client-san needs --tls-client-ca"},
		{"empty SAN list", func(o *Options) {
			o.TLSCert, o.TLSKey, o.TLSClientCA, o.TLSClientSAN = p.ServerCert, p.ServerKey, p.CA, " , "
		}, "at least one name"},
		{"Redis cert without key", func(o *Options) {
			o.Redis, o.RedisTLSCert = "rediss://127.0.0.1:1", p.ClientCert
		}, "go together"},
		{"Redis cert on redis://", func(o *Options) {
			o.Redis, o.RedisTLSCert, o.RedisTLSKey = "redis://127.0.0.1:1", p.ClientCert, p.ClientKey
		}, "needs a TLS URL"},
		{"Redis key of another cert", func(o *Options) {
			o.Redis, o.RedisTLSCert, o.RedisTLSKey = "rediss://127.0.0.1:1", p.ClientCert, p.ServerKey
		}, "private key does not match"},
		{"server key of another cert", func(o *Options) {
			o.TLSCert, o.TLSKey = p.ServerCert, p.ClientKey
		}, "private key does not match"},
		{"admin CA without TLS", func(o *Options) {
			o.AdminAddr, o.AdminTLSClientCA = "127.0.0.1:0", p.OtherCA
		}, "--admin-tls-client-ca needs --tls-cert"},
		{"admin SAN without admin CA", func(o *Options) {
			o.AdminAddr, o.TLSCert, o.TLSKey, o.AdminTLSClientSAN = "127.0.0.1:0", p.ServerCert, p.ServerKey, "ops"
		}, "--admin-tls-client-san needs --admin-tls-client-ca"},
		{"admin CA not PEM", func(o *Options) {
			o.AdminAddr, o.TLSCert, o.TLSKey, o.AdminTLSClientCA = "127.0.0.1:0", p.ServerCert, p.ServerKey, p.ServerKey
		}, "admin TLS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := testOptions()
			tt.set(&opts)
			if err := runErr(t, opts); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%v, want an error containing %q", err, tt.want)
			}
		})
	}
}
