package pkitest

import (
	"context"
	"crypto/tls"
	"math/big"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
)

// DialGRPC connects to addr over TLS trusting p's CA and presenting
// client (none if its Certificate is empty); the connection is closed at
// the test's end.
func (p PKI) DialGRPC(t testing.TB, addr string, client tls.Certificate) *grpc.ClientConn {
	t.Helper()
	cfg := &tls.Config{RootCAs: p.Roots, ServerName: ServerName}
	if len(client.Certificate) > 0 {
		cfg.Certificates = []tls.Certificate{client}
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// ServerSerial makes a health call on conn and returns the serial number
// of the certificate the server presented on that connection.
func ServerSerial(t testing.TB, conn *grpc.ClientConn) (*big.Int, error) {
	t.Helper()
	var p peer.Peer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p)); err != nil {
		return nil, err
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		t.Fatalf("peer auth info %T, want TLS", p.AuthInfo)
	}
	return info.State.PeerCertificates[0].SerialNumber, nil
}
