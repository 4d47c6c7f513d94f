package redis_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/bucket"
	"github.com/sluice-rls/sluice/internal/redistest"
)

// The deployments of --redis other than a plain single server, each against
// real processes: AUTH, TLS and Sentinel. ParseURL builds the options, as
// `rls serve --redis URL` does, and one decision must go through.

func decideOnce(t *testing.T, url string, tweak func(*goredis.UniversalOptions)) {
	t.Helper()
	opts, err := redisbackend.ParseURL(url, time.Second)
	if err != nil {
		t.Fatalf("ParseURL(%q): %v", url, err)
	}
	if tweak != nil {
		tweak(opts)
	}
	client := goredis.NewUniversalClient(opts)
	defer client.Close()
	lim := redisbackend.New(redisbackend.Options{Client: client, Timeout: time.Second})
	defer lim.Close()
	hits := []bucket.Hit{{Key: bucket.Key{1, 2, 3}, Limit: bucket.Limit{Requests: 1, Period: time.Minute, Burst: 1}, Cost: 1}}
	states := make([]bucket.State, 1)
	for i, want := range []bool{true, false} {
		d, err := lim.Hit(context.Background(), hits, states)
		ok := d.Allowed
		if err != nil {
			t.Fatalf("Hit %d over %s: %v", i, url, err)
		}
		if ok != want {
			t.Fatalf("Hit %d over %s: allowed %v, want %v", i, url, ok, want)
		}
	}
}

func TestDeployAUTH(t *testing.T) {
	srv := redistest.Start(t, redistest.WithArgs("--requirepass", "s3cret"))
	decideOnce(t, "redis://:s3cret@"+srv.Addr()+"/0", nil)

	opts, err := redisbackend.ParseURL("redis://:wrong@"+srv.Addr()+"/0", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	client := goredis.NewUniversalClient(opts)
	defer client.Close()
	lim := redisbackend.New(redisbackend.Options{Client: client, Timeout: time.Second})
	defer lim.Close()
	if err := lim.Ping(context.Background()); err == nil || strings.Contains(err.Error(), "wrong") {
		t.Errorf("wrong password: Ping = %v, want an error that does not echo the password", err)
	}
}

func TestDeployTLS(t *testing.T) {
	bin := lookRedis(t)
	dir := t.TempDir()
	caPEM, certPEM, keyPEM := tlsFiles(t)
	for name, data := range map[string][]byte{"ca.pem": caPEM, "cert.pem": certPEM, "key.pem": keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	port := freeTCPPort(t)
	startProcess(t, bin, "--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--tls-cert-file", filepath.Join(dir, "cert.pem"), "--tls-key-file", filepath.Join(dir, "key.pem"),
		"--tls-ca-cert-file", filepath.Join(dir, "ca.pem"), "--tls-auth-clients", "no",
		"--save", "", "--appendonly", "no", "--dir", dir)
	waitListening(t, port)

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	decideOnce(t, "rediss://127.0.0.1:"+strconv.Itoa(port)+"/0", func(o *goredis.UniversalOptions) {
		if o.TLSConfig == nil {
			t.Fatal("rediss:// gave no TLS config")
		}
		o.TLSConfig.RootCAs = roots // the operator's CA: SSL_CERT_FILE in production
	})
}

// TestDeployUnixSocket decides over Redis' unix socket (unix:// URL), with
// the database and password in the URL.
func TestDeployUnixSocket(t *testing.T) {
	srv := redistest.Start(t, redistest.WithUnixSocket(), redistest.WithArgs("--requirepass", "s3cret"))
	decideOnce(t, "unix://:s3cret@"+srv.Socket()+"?db=1", nil)
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), Password: "s3cret", DB: 1})
	defer c.Close()
	if keys, err := c.Keys(context.Background(), "*").Result(); err != nil || len(keys) == 0 {
		t.Errorf("database 1 after deciding over the socket: keys %q, %v; want the bucket there", keys, err)
	}
}

func TestDeploySentinel(t *testing.T) {
	bin := lookRedis(t)
	master := redistest.Start(t)
	dir := t.TempDir()
	port := freeTCPPort(t)
	conf := filepath.Join(dir, "sentinel.conf")
	body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor mymaster 127.0.0.1 %d 1\n", port, dir, master.Port())
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	startProcess(t, bin, conf, "--sentinel")
	waitListening(t, port)
	decideOnce(t, "sentinel://mymaster@127.0.0.1:"+strconv.Itoa(port)+"/0", nil)
}

func lookRedis(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("RLS_REQUIRE_REDIS") == "1" {
			t.Fatal("redis-server not found")
		}
		t.Skip("redis-server not found")
	}
	return bin
}

// startProcess runs bin with args, killed by PID at cleanup.
func startProcess(t *testing.T, bin string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
}

func freeTCPPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitListening polls until something accepts connections on port.
func waitListening(t *testing.T, port int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), 100*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on %d: %v", port, err)
		}
		time.Sleep(10 * time.Millisecond) // poll interval, bounded by the deadline
	}
}

// tlsFiles returns a CA and a server certificate for 127.0.0.1, in PEM.
func tlsFiles(t *testing.T) (caPEM, certPEM, keyPEM []byte) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalPKCS8PrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}
