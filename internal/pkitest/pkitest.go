// Package pkitest makes a throwaway PKI for TLS and mTLS tests: a CA, a
// server certificate and a client certificate, written as PEM files.
package pkitest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// ServerName is the DNS name of the server certificate, which also holds
// the IP address 127.0.0.1.
const ServerName = "sluice"

// PKI is a CA, a server certificate signed by it for ServerName and
// 127.0.0.1, a client certificate signed by it, and a second CA that signed
// nothing. The string fields are paths of PEM files.
type PKI struct {
	CA, OtherCA           string
	ServerCert, ServerKey string
	ClientCert, ClientKey string
	Roots                 *x509.CertPool // holds CA
	Server, Client        tls.Certificate

	ca    *x509.Certificate
	caKey *ecdsa.PrivateKey
}

// Leaf is one more certificate signed by a PKI's CA: its PEM files and the
// loaded pair.
type Leaf struct {
	Cert, Key string
	Pair      tls.Certificate
}

// IssueServer signs a new server certificate for ServerName and 127.0.0.1,
// with a new key and serial number, and writes it to cert.pem and key.pem
// in dir (replacing them: a certificate rotation).
func (p PKI) IssueServer(t testing.TB, dir string) Leaf {
	t.Helper()
	cert, key := newLeaf(t, p.ca, p.caKey, leafSpec{name: ServerName, server: true})
	return writeLeaf(t, dir, cert, key)
}

// IssueServerClient signs a certificate for ServerName and 127.0.0.1 that
// serves and also authenticates as a client (as Envoy Gateway's rate-limit
// certificate, which both serves gRPC and authenticates to the xDS server),
// written to a new temporary directory of t.
func (p PKI) IssueServerClient(t testing.TB) Leaf {
	t.Helper()
	cert, key := newLeaf(t, p.ca, p.caKey, leafSpec{name: ServerName, server: true, client: true})
	return writeLeaf(t, t.TempDir(), cert, key)
}

// IssueClient signs a new client certificate carrying dnsNames and uris as
// SANs, written to a new temporary directory of t.
func (p PKI) IssueClient(t testing.TB, dnsNames, uris []string) Leaf {
	t.Helper()
	spec := leafSpec{name: "client", dnsNames: dnsNames}
	for _, s := range uris {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		spec.uris = append(spec.uris, u)
	}
	cert, key := newLeaf(t, p.ca, p.caKey, spec)
	return writeLeaf(t, t.TempDir(), cert, key)
}

func writeLeaf(t testing.TB, dir string, cert, key []byte) Leaf {
	t.Helper()
	l := Leaf{Cert: writePEM(t, dir, "cert.pem", "CERTIFICATE", cert), Key: writePEM(t, dir, "key.pem", "PRIVATE KEY", key)}
	var err error
	if l.Pair, err = tls.LoadX509KeyPair(l.Cert, l.Key); err != nil {
		t.Fatal(err)
	}
	return l
}

// New writes a PKI, valid for an hour either side of now, to a temporary
// directory of t.
func New(t testing.TB) PKI {
	t.Helper()
	dir := t.TempDir()
	ca, caKey := newCA(t, "sluice test CA")
	other, _ := newCA(t, "another CA")
	p := PKI{
		CA:      writePEM(t, dir, "ca.pem", "CERTIFICATE", ca.Raw),
		OtherCA: writePEM(t, dir, "other-ca.pem", "CERTIFICATE", other.Raw),
		Roots:   x509.NewCertPool(),
		ca:      ca,
		caKey:   caKey,
	}
	p.Roots.AddCert(ca)
	sc, sk := newLeaf(t, ca, caKey, leafSpec{name: ServerName, server: true})
	p.ServerCert = writePEM(t, dir, "server.pem", "CERTIFICATE", sc)
	p.ServerKey = writePEM(t, dir, "server-key.pem", "PRIVATE KEY", sk)
	cc, ck := newLeaf(t, ca, caKey, leafSpec{name: "envoy"})
	p.ClientCert = writePEM(t, dir, "client.pem", "CERTIFICATE", cc)
	p.ClientKey = writePEM(t, dir, "client-key.pem", "PRIVATE KEY", ck)
	var err error
	if p.Server, err = tls.LoadX509KeyPair(p.ServerCert, p.ServerKey); err != nil {
		t.Fatal(err)
	}
	if p.Client, err = tls.LoadX509KeyPair(p.ClientCert, p.ClientKey); err != nil {
		t.Fatal(err)
	}
	return p
}

func newCA(t testing.TB, name string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
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

// leafSpec says what newLeaf signs: a server certificate for name and
// 127.0.0.1, or a client certificate with subject name and the given SANs.
type leafSpec struct {
	name     string
	server   bool
	client   bool // with server: a client certificate too
	dnsNames []string
	uris     []*url.URL
}

// newLeaf returns a DER certificate, with a random serial number, and its
// PKCS#8 key, signed by ca.
func newLeaf(t testing.TB, ca *x509.Certificate, caKey *ecdsa.PrivateKey, spec leafSpec) (certDER, keyDER []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: spec.name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		DNSNames:     spec.dnsNames,
		URIs:         spec.uris,
	}
	if spec.server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		if spec.client {
			tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
		}
		tmpl.DNSNames = []string{spec.name}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	if certDER, err = x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey); err != nil {
		t.Fatal(err)
	}
	if keyDER, err = x509.MarshalPKCS8PrivateKey(key); err != nil {
		t.Fatal(err)
	}
	return certDER, keyDER
}

func writePEM(t testing.TB, dir, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
