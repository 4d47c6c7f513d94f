package node

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
)

// certCheckEvery is how often, at most, certFiles looks whether its files
// changed: at the first TLS handshake this long after the last look.
const certCheckEvery = time.Second

// certFiles is a key pair, and optionally a CA bundle, read from PEM files
// and read again when the files change, so that renewed certificates
// (cert-manager, a Kubernetes Secret volume) take effect without a restart.
//
// It needs no goroutine and no file watch: get, called on each TLS
// handshake, stats the files at most once per certCheckEvery. os.Stat
// follows symlinks, so a Secret volume's swapped ..data link shows as
// another file, as does an in-place rewrite (new modification time). New
// files that fail to load (a key that does not match, a half-written file)
// are logged and counted once, and the running material stays; they are
// tried again when they change again.
type certFiles struct {
	name               string // the ratelimit_tls_* label: "grpc" or "redis"
	cert, key, caFile  string // caFile "": no CA bundle
	clock              clockwork.Clock
	log                *slog.Logger
	loads              *prometheus.CounterVec // result: success, error
	cur                atomic.Pointer[certMaterial]
	mu                 sync.Mutex    // held by the one handshake that checks the files
	next               time.Time     // no look before this
	loadedAt, failedAt []os.FileInfo // the files in use; the last ones that failed
	failedErr          string        // the last failure's error
}

// certMaterial is one successful read of the files.
type certMaterial struct {
	pair tls.Certificate // pair.Leaf is parsed
	pool *x509.CertPool  // nil without a CA bundle
}

// certFilesOptions are newCertFiles' arguments.
type certFilesOptions struct {
	Name          string // "grpc" or "redis": label and log field
	Cert, Key, CA string // PEM files; CA optional
	Clock         clockwork.Clock
	Log           *slog.Logger
	Reg           prometheus.Registerer
}

// newCertFiles reads the files once: an error there stops the start. It
// registers ratelimit_tls_loads_total and
// ratelimit_tls_cert_expiry_timestamp_seconds for o.Name.
func newCertFiles(o certFilesOptions) (*certFiles, error) {
	c := &certFiles{name: o.Name, cert: o.Cert, key: o.Key, caFile: o.CA, clock: o.Clock, log: o.Log}
	stamps, err := c.stat()
	if err != nil {
		return nil, err
	}
	m, err := c.read()
	if err != nil {
		return nil, err
	}
	c.cur.Store(m)
	c.loadedAt = stamps
	c.next = c.clock.Now().Add(certCheckEvery)
	c.loads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name:        "ratelimit_tls_loads_total",
		Help:        "Reads of TLS certificate files (the one at start and each after the files changed), by result; on error the previous certificate stays in use.",
		ConstLabels: prometheus.Labels{"certificate": o.Name},
	}, []string{"result"})
	o.Reg.MustRegister(c.loads, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "ratelimit_tls_cert_expiry_timestamp_seconds",
		Help:        "Unix time at which the TLS certificate in use expires (its NotAfter).",
		ConstLabels: prometheus.Labels{"certificate": o.Name},
	}, func() float64 { return float64(c.cur.Load().pair.Leaf.NotAfter.Unix()) }))
	c.loads.WithLabelValues("success").Inc()
	c.loads.WithLabelValues("error") // exported as 0 from the start
	return c, nil
}

// get returns the material in use, first reading the files again if they
// changed and were not looked at for certCheckEvery. Handshakes that arrive
// while another one looks do not wait: they get the material in use.
func (c *certFiles) get() *certMaterial {
	if c.mu.TryLock() {
		if now := c.clock.Now(); !now.Before(c.next) {
			c.next = now.Add(certCheckEvery)
			c.refresh()
		}
		c.mu.Unlock()
	}
	return c.cur.Load()
}

// refresh reads the files when they differ from those in use and from the
// last ones that failed. A failure is logged and counted once: again only
// when the files change again (or, for a missing file, when the error
// changes). c.mu is held.
func (c *certFiles) refresh() {
	stamps, err := c.stat()
	if err == nil && sameFiles(stamps, c.loadedAt) {
		c.failedAt, c.failedErr = nil, "" // back to the files in use
		return
	}
	if err == nil && sameFiles(stamps, c.failedAt) {
		return
	}
	var m *certMaterial
	if err == nil {
		m, err = c.read()
	}
	if err != nil {
		if stamps == nil && err.Error() == c.failedErr {
			return // still missing
		}
		c.failedAt, c.failedErr = stamps, err.Error()
		c.loads.WithLabelValues("error").Inc()
		c.log.Error("TLS certificate files changed but cannot be used; keeping the running certificate",
			"certificate", c.name, "cert", c.cert, "err", err)
		return
	}
	c.cur.Store(m)
	c.loadedAt, c.failedAt, c.failedErr = stamps, nil, ""
	c.loads.WithLabelValues("success").Inc()
	c.log.Info("TLS certificate reloaded", "certificate", c.name, "cert", c.cert,
		"serial", m.pair.Leaf.SerialNumber.String(), "not_after", m.pair.Leaf.NotAfter)
}

// stat returns what identifies the files' current content: the file each
// path leads to (after symlinks), its size and modification time.
func (c *certFiles) stat() ([]os.FileInfo, error) {
	paths := []string{c.cert, c.key}
	if c.caFile != "" {
		paths = append(paths, c.caFile)
	}
	out := make([]os.FileInfo, len(paths))
	for i, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		out[i] = st
	}
	return out, nil
}

// sameFiles reports whether a and b are the very same files, unchanged.
func sameFiles(a, b []os.FileInfo) bool {
	if len(a) != len(b) || a == nil {
		return false
	}
	for i := range a {
		if !os.SameFile(a[i], b[i]) || a[i].Size() != b[i].Size() || !a[i].ModTime().Equal(b[i].ModTime()) {
			return false
		}
	}
	return true
}

// read loads the key pair and the CA bundle.
func (c *certFiles) read() (*certMaterial, error) {
	pair, err := tls.LoadX509KeyPair(c.cert, c.key)
	if err != nil {
		return nil, fmt.Errorf("%s TLS key pair: %w", c.name, err)
	}
	// LoadX509KeyPair parses the leaf (Go ≥ 1.23); kept for the metrics and logs.
	if pair.Leaf == nil {
		if pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("%s TLS certificate: %w", c.name, err)
		}
	}
	m := &certMaterial{pair: pair}
	if c.caFile != "" {
		if m.pool, err = LoadCertPool(c.caFile); err != nil {
			return nil, fmt.Errorf("%s TLS client CA: %w", c.name, err)
		}
	}
	return m, nil
}
