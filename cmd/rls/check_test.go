package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluice-rls/sluice/internal/pkitest"
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

// startStubRLS serves stubRLS on 127.0.0.1 with TLS, requiring a client
// certificate signed by the PKI's CA.
func startStubRLS(t *testing.T, p pkitest.PKI) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{p.Server},
		ClientCAs:    p.Roots,
		ClientAuth:   tls.RequireAndVerifyClientCert,
	})))
	rlsv3.RegisterRateLimitServiceServer(s, stubRLS{})
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

func TestCheckExitCodesAndTLS(t *testing.T) {
	p := pkitest.New(t)
	addr := startStubRLS(t, p)
	mtls := []string{"--addr", addr, "--tls-ca", p.CA, "--tls-cert", p.ClientCert, "--tls-key", p.ClientKey}
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
		{"server signed by another CA", []string{"--addr", addr, "--tls-ca", p.OtherCA, "--tls-cert", p.ClientCert, "--tls-key", p.ClientKey, "user_id=a"}, 2, "", "certificate"},
		{"no client certificate", []string{"--addr", addr, "--tls-ca", p.CA, "user_id=a"}, 2, "", "ShouldRateLimit"},
		{"plaintext to a TLS server", []string{"--addr", addr, "user_id=a"}, 2, "", "ShouldRateLimit"},
		{"CA file is not PEM", []string{"--addr", addr, "--tls-ca", p.ClientKey, "user_id=a"}, 2, "", "no PEM certificates"},
		{"cert without key", []string{"--addr", addr, "--tls-ca", p.CA, "--tls-cert", p.ClientCert, "user_id=a"}, 2, "", "go together"},
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

// TestCheckHelp: -h prints the usage and succeeds; it used to exit 2.
func TestCheckHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if err := check(context.Background(), []string{"-h"}, &stdout, &stderr); err != nil {
		t.Fatalf("check -h = %v, want nil", err)
	}
	if !strings.Contains(stderr.String(), "-domain") {
		t.Errorf("check -h printed no usage: %q", stderr.String())
	}
}
