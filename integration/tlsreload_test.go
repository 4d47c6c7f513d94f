//go:build integration

package integration

import (
	"context"
	"crypto/tls"
	"math/big"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/sluice-rls/sluice/internal/pkitest"
)

// secretDir lays TLS files out as the kubelet does for a Secret volume
// (dir/tls.crt → ..data/tls.crt, ..data → ..vN) and publishes new versions
// by swapping ..data in one rename.
type secretDir struct {
	t       *testing.T
	dir     string
	version int
}

func newSecretDir(t *testing.T) *secretDir {
	d := &secretDir{t: t, dir: t.TempDir()}
	for _, name := range []string{"tls.crt", "tls.key", "ca.crt"} {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(d.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

func (d *secretDir) path(name string) string { return filepath.Join(d.dir, name) }

func (d *secretDir) publish(cert, key, ca string) {
	t := d.t
	t.Helper()
	d.version++
	ver := "..v" + strconv.Itoa(d.version)
	if err := os.Mkdir(filepath.Join(d.dir, ver), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, src := range map[string]string{"tls.crt": cert, "tls.key": key, "ca.crt": ca} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d.dir, ver, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	tmp := filepath.Join(d.dir, "..data_tmp")
	if err := os.Symlink(ver, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(d.dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

// tlsCall makes one ShouldRateLimit call on a new connection to addr,
// presenting client, and returns the serial number of the server's
// certificate.
func tlsCall(addr string, p pkitest.PKI, client tls.Certificate) (*big.Int, error) {
	creds := credentials.NewTLS(&tls.Config{RootCAs: p.Roots, Certificates: []tls.Certificate{client}, ServerName: pkitest.ServerName})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var pr peer.Peer
	if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, request("edge", "user_id=tls"), grpc.Peer(&pr)); err != nil {
		return nil, err
	}
	return pr.AuthInfo.(credentials.TLSInfo).State.PeerCertificates[0].SerialNumber, nil
}

// TestTLSRenewalWithoutRestart: rls serve, with its certificate in a Secret
// volume layout, serves a renewed certificate to new connections without a
// restart, on gRPC and on the admin listener; with --tls-client-san, a
// client certificate without the name is refused.
func TestTLSRenewalWithoutRestart(t *testing.T) {
	t.Parallel()
	p := pkitest.New(t)
	vol := newSecretDir(t)
	first := p.IssueServer(t, t.TempDir())
	vol.publish(first.Cert, first.Key, p.CA)
	rls := startRLS(t, "--tls-cert", vol.path("tls.crt"), "--tls-key", vol.path("tls.key"), "--tls-client-ca", vol.path("ca.crt"),
		"--tls-client-san", "envoy.edge.svc.cluster.local")
	envoy := p.IssueClient(t, []string{"envoy.edge.svc.cluster.local"}, nil).Pair

	got, err := tlsCall(rls.GRPCAddr, p, envoy)
	if err != nil || got.Cmp(first.Pair.Leaf.SerialNumber) != 0 {
		t.Fatalf("first call: serial %v, %v; want %v", got, err, first.Pair.Leaf.SerialNumber)
	}
	if _, err := tlsCall(rls.GRPCAddr, p, p.Client); err == nil {
		t.Error("a client certificate without the --tls-client-san name was served")
	}

	second := p.IssueServer(t, t.TempDir())
	vol.publish(second.Cert, second.Key, p.CA)
	pollUntil(t, "the renewed certificate on a new gRPC connection", func() bool {
		got, err := tlsCall(rls.GRPCAddr, p, envoy)
		return err == nil && got.Cmp(second.Pair.Leaf.SerialNumber) == 0
	})
	conn, err := tls.Dial("tcp", rls.AdminAddr, &tls.Config{RootCAs: p.Roots, Certificates: []tls.Certificate{envoy}, ServerName: pkitest.ServerName})
	if err != nil {
		t.Fatalf("admin listener: %v", err)
	}
	defer conn.Close()
	if got := conn.ConnectionState().PeerCertificates[0].SerialNumber; got.Cmp(second.Pair.Leaf.SerialNumber) != 0 {
		t.Errorf("admin listener after the renewal: serial %v, want %v", got, second.Pair.Leaf.SerialNumber)
	}
}
