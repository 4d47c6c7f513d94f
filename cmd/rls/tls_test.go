package main

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/internal/logtest"
	"github.com/sluice-rls/sluice/internal/pkitest"
	"github.com/sluice-rls/sluice/internal/redistest"
	"github.com/sluice-rls/sluice/node"
)

func TestServerTLSFlagsErrors(t *testing.T) {
	p := pkitest.New(t)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"SAN without client CA", []string{"--tls-cert", p.ServerCert, "--tls-key", p.ServerKey, "--tls-client-san", "envoy"}, "--tls-client-san needs --tls-client-ca"},
		{"empty SAN list", []string{"--tls-cert", p.ServerCert, "--tls-key", p.ServerKey, "--tls-client-ca", p.CA, "--tls-client-san", " , "}, "at least one name"},
		{"Redis cert without key", []string{"--redis", "rediss://127.0.0.1:1", "--redis-tls-cert", p.ClientCert}, "go together"},
		{"Redis cert on redis://", []string{"--redis", "redis://127.0.0.1:1", "--redis-tls-cert", p.ClientCert, "--redis-tls-key", p.ClientKey}, "needs a TLS URL"},
		{"Redis key of another cert", []string{"--redis", "rediss://127.0.0.1:1", "--redis-tls-cert", p.ClientCert, "--redis-tls-key", p.ServerKey}, "private key does not match"},
		{"server key of another cert", []string{"--tls-cert", p.ServerCert, "--tls-key", p.ClientKey}, "private key does not match"},
		{"admin CA without TLS", []string{"--admin-addr", "127.0.0.1:0", "--admin-tls-client-ca", p.OtherCA}, "--admin-tls-client-ca needs --tls-cert"},
		{"admin SAN without admin CA", []string{"--admin-addr", "127.0.0.1:0", "--tls-cert", p.ServerCert, "--tls-key", p.ServerKey, "--admin-tls-client-san", "ops"}, "--admin-tls-client-san needs --admin-tls-client-ca"},
		{"admin CA not PEM", []string{"--admin-addr", "127.0.0.1:0", "--tls-cert", p.ServerCert, "--tls-key", p.ServerKey, "--admin-tls-client-ca", p.ServerKey}, "admin TLS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out logtest.Buffer
			args := append([]string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", ""}, tt.args...)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			err := run(ctx, args, &out, &out, noEnv)
			if err == nil || !strings.Contains(err.Error()+out.String(), tt.want) {
				t.Errorf("rls %q: %v\n%s\nwant an error containing %q", tt.args, err, out.String(), tt.want)
			}
		})
	}
}

// TestServeRedisClientCert runs serve against a real redis-server that
// requires client certificates (tls-auth-clients yes): with --redis-tls-cert
// and --redis-tls-key the node decides in Redis (the request's bucket is
// there); without a certificate Redis refuses a client.
func TestServeRedisClientCert(t *testing.T) {
	p := pkitest.New(t)
	srv := redistest.Start(t, redistest.WithTLS(p, true))
	redisURL := "rediss://" + srv.Addr() + "/0"

	opts, err := redisbackend.ParseURL(redisURL, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := node.TrustCA(opts, p.CA); err != nil {
		t.Fatal(err)
	}
	noCert := goredis.NewUniversalClient(opts)
	defer noCert.Close()
	if err := noCert.Ping(context.Background()).Err(); err == nil {
		t.Fatal("Redis with tls-auth-clients yes answered a client without a certificate")
	}

	rls := serveInProcess(t, noEnv, loopback("--redis", redisURL, "--redis-ca", p.CA,
		"--redis-tls-cert", p.ClientCert, "--redis-tls-key", p.ClientKey, "--redis-timeout", "1s")...)
	// The example rules limit user_id globally: the decision leaves its
	// bucket in Redis before the answer, unless the node is in fallback.
	if _, err := rls.Client().ShouldRateLimit(context.Background(), edgeRequest("user_id", "tls-client")); err != nil {
		t.Fatal(err)
	}
	opts.TLSConfig.Certificates = []tls.Certificate{p.Client}
	withCert := goredis.NewUniversalClient(opts)
	defer withCert.Close()
	keys, err := withCert.Keys(context.Background(), "*").Result()
	if err != nil || len(keys) == 0 {
		t.Errorf("keys in Redis after a decision: %q, %v; want the bucket\nlog:\n%s", keys, err, rls.Log.String())
	}
	if strings.Contains(rls.Log.String(), "fallback") {
		t.Errorf("the node went to fallback:\n%s", rls.Log.String())
	}
	rls.StopCleanly()
}
