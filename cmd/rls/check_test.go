package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/durationpb"

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
	if err := check(context.Background(), []string{"-h"}, &stdout, &stderr, func(string) string { return "" }); err != nil {
		t.Fatalf("check -h = %v, want nil", err)
	}
	if !strings.Contains(stderr.String(), "-domain") {
		t.Errorf("check -h printed no usage: %q", stderr.String())
	}
}

// limitRLS answers domain edge OK with a limit of 10/second and
// 962.166254ms until the bucket is full, other domains OK without a limit
// (as sluice answers a domain it has no rules for); it keeps the last
// request.
type limitRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	mu   sync.Mutex
	last *rlsv3.RateLimitRequest
}

func (s *limitRLS) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	s.mu.Lock()
	s.last = req
	s.mu.Unlock()
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	for range req.GetDescriptors() {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		if req.GetDomain() == "edge" {
			st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 10, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND}
			st.LimitRemaining = 9
			st.DurationUntilReset = durationpb.New(962166254 * time.Nanosecond)
		}
		resp.Statuses = append(resp.Statuses, st)
	}
	return resp, nil
}

func (s *limitRLS) lastRequest() *rlsv3.RateLimitRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// startLimitRLS serves a limitRLS on 127.0.0.1, plaintext.
func startLimitRLS(t *testing.T) (*limitRLS, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &limitRLS{}
	s := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(s, srv)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	return srv, lis.Addr().String()
}

// TestCheckFlagsAfterDescriptors: a flag after a descriptor is a flag
// (on main --hits was read as a descriptor: exit 2); after --, an argument
// is a descriptor even when it starts with a dash.
func TestCheckFlagsAfterDescriptors(t *testing.T) {
	srv, addr := startLimitRLS(t)
	code, stdout, stderr := runRLS(t, nil, "check", "--addr", addr, "user_id=a", "--hits", "21")
	if code != 0 || srv.lastRequest().GetHitsAddend() != 21 {
		t.Errorf("check user_id=a --hits 21: exit %d, hits_addend %d; stdout %q, stderr %q; want exit 0, 21", code, srv.lastRequest().GetHitsAddend(), stdout, stderr)
	}
	code, _, stderr = runRLS(t, nil, "check", "--addr", addr, "--", "-x=1")
	if code != 0 || srv.lastRequest().GetDescriptors()[0].GetEntries()[0].GetKey() != "-x" {
		t.Errorf("check -- -x=1: exit %d, stderr %q, request %v; want descriptor -x=1", code, stderr, srv.lastRequest())
	}
	if code, _, stderr := runRLS(t, nil, "check", "--addr", addr, "user_id=a", "--hits", "4294967296"); code != 2 || !strings.Contains(stderr, "--hits") {
		t.Errorf("check --hits 2^32: exit %d, stderr %q; want a usage error (exit 2), not a silent wrap to 0", code, stderr)
	}
}

// TestCheckOutput: durations are rounded (on main "962.166254ms"), the
// emergency key's value is never printed (on main it was echoed), and an
// answer without any limit says why it may be (on main: OK, no hint).
func TestCheckOutput(t *testing.T) {
	_, addr := startLimitRLS(t)
	code, stdout, stderr := runRLS(t, nil, "check", "--addr", addr, "user_id=a", "emergency=s3cret-value,user_id=b")
	if code != 0 || !strings.Contains(stdout, "full in 962ms") || strings.Contains(stdout, "962.1") {
		t.Errorf("check: exit %d, stdout %q; want exit 0 and full in 962ms", code, stdout)
	}
	if strings.Contains(stdout+stderr, "s3cret") || !strings.Contains(stdout, "emergency=***,user_id=b") {
		t.Errorf("check with an emergency entry printed %q, %q; want its value hidden", stdout, stderr)
	}
	if strings.Contains(stderr, "no rule") {
		t.Errorf("check on a limited domain: stderr %q, want no hint", stderr)
	}
	env := map[string]string{"RLS_EMERGENCY_KEY": "break_glass"}
	if _, stdout, _ := runRLS(t, env, "check", "--addr", addr, "break_glass=s3cret-value"); strings.Contains(stdout, "s3cret") {
		t.Errorf("check with RLS_EMERGENCY_KEY=break_glass printed %q, want the value hidden", stdout)
	}

	code, stdout, stderr = runRLS(t, nil, "check", "--addr", addr, "--domain", "egde", "user_id=a")
	if code != 0 || !strings.HasPrefix(stdout, "OK") || !strings.Contains(stderr, `no rule of domain "egde" matched`) {
		t.Errorf("check --domain egde: exit %d, stdout %q, stderr %q; want OK and a hint on stderr", code, stdout, stderr)
	}
}
