package node

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// minTokenBytes is the shortest bearer token --admin-token-file accepts:
// a guessable token would open the door the endpoint guards.
const minTokenBytes = 16

// adminAuth authenticates the calls of the admin endpoints that change
// state (/overrides). With --admin-token-file a call needs
// "Authorization: Bearer <token>" of one of its tokens, and its author is
// that token's name. Without it, with --admin-tls-client-ca, the admin
// listener already requires a verified operator's client certificate, and
// the author is its subject. With neither, nothing is authenticated and
// the endpoints are not served. gRPC's --tls-client-ca never makes an
// operator: it verifies Envoy.
//
// The token file is the list of valid tokens, read again on every
// authenticated call and every metrics scrape: a token no longer in it is
// refused from the next call on. A file that cannot be used (deleted,
// empty, a line that does not parse) revokes every token, is logged at
// error and shows in ratelimit_admin_token_file_valid: it fails closed,
// never on the tokens of an older file.
type adminAuth struct {
	tokenFile string
	mtls      bool
	log       *slog.Logger

	mu      sync.Mutex // held for a whole reload
	tokens  []namedToken
	started bool   // the file was usable once: later errors are logged
	lastErr string // the last reload's error; "" when it succeeded
	errors  prometheus.Counter
}

// namedToken is one line of the token file, the token kept as its digest
// so that comparisons take the same time whatever it is, and whatever its
// length.
type namedToken struct {
	name   string
	digest [sha256.Size]byte
}

// errUnauthenticated is the reason a call is refused with 401.
var errUnauthenticated = errors.New("unauthenticated")

// newAdminAuth returns the authentication of --admin-token-file and, mtls
// true, of the admin listener's --admin-tls-client-ca. A token file that
// cannot be read or holds no valid token is an error at start; later, it
// revokes every token until it is fixed. It registers
// ratelimit_admin_token_file_valid and
// ratelimit_admin_token_file_errors_total on reg when there is a token file.
func newAdminAuth(tokenFile string, mtls bool, log *slog.Logger, reg prometheus.Registerer) (*adminAuth, error) {
	a := &adminAuth{tokenFile: tokenFile, mtls: mtls, log: log}
	if tokenFile == "" {
		return a, nil
	}
	a.errors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "ratelimit_admin_token_file_errors_total",
		Help: "Times --admin-token-file was found unusable after it had been usable or had another error: each revoked every admin token.",
	})
	if err := a.reload(); err != nil {
		return nil, err
	}
	reg.MustRegister(a.errors, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ratelimit_admin_token_file_valid",
		Help: "1 while --admin-token-file holds valid tokens; 0 while it cannot be used (deleted, empty, a line that does not parse) and every admin token is refused. Read again at each scrape.",
	}, func() float64 {
		if a.reload() != nil {
			return 0
		}
		return 1
	}))
	return a, nil
}

// enabled reports whether any authentication is configured.
func (a *adminAuth) enabled() bool { return a.tokenFile != "" || a.mtls }

// reload re-reads the token file. It runs on every authenticated call and
// every scrape: admin calls are rare, and a file read (unlike a
// modification time) never misses a rewrite. The tokens in use become
// exactly those of the file; when it cannot be used, none. A new error is
// logged and counted once; the return to a usable file is logged too.
func (a *adminAuth) reload() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	tokens, err := readTokens(a.tokenFile)
	if err != nil {
		if a.started && err.Error() != a.lastErr { // at start, newAdminAuth returns it
			a.errors.Inc()
			a.log.Error("admin token file cannot be used: every admin token is revoked until it is fixed",
				"file", a.tokenFile, "err", err)
		}
		a.tokens, a.lastErr = nil, err.Error()
		return err
	}
	if a.lastErr != "" {
		a.log.Info("admin token file usable again", "file", a.tokenFile, "tokens", len(tokens))
	} else if gone := revokedNames(a.tokens, tokens); len(gone) > 0 {
		a.log.Info("admin tokens revoked by a rewrite of the token file", "file", a.tokenFile, "names", gone)
	}
	a.tokens, a.lastErr, a.started = tokens, "", true
	return nil
}

// readTokens reads and parses the token file.
func readTokens(path string) ([]namedToken, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--admin-token-file: %w", err)
	}
	tokens, err := parseTokens(data)
	if err != nil {
		return nil, fmt.Errorf("--admin-token-file %s: %w", path, err)
	}
	return tokens, nil
}

// revokedNames returns the names of the tokens of old that new does not
// hold (by token, not by name).
func revokedNames(old, new []namedToken) []string {
	var out []string
	for _, o := range old {
		if !slices.ContainsFunc(new, func(n namedToken) bool { return n.digest == o.digest }) {
			out = append(out, o.name)
		}
	}
	return out
}

// parseTokens reads "name:token" lines; blank lines and lines starting
// with # are skipped.
func parseTokens(data []byte) ([]namedToken, error) {
	var out []namedToken
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, tok, ok := strings.Cut(line, ":")
		name, tok = strings.TrimSpace(name), strings.TrimSpace(tok)
		switch {
		case !ok || name == "":
			return nil, fmt.Errorf("line %d: want name:token", n)
		case len(tok) < minTokenBytes:
			return nil, fmt.Errorf("line %d: the token of %q is shorter than %d bytes", n, name, minTokenBytes)
		}
		out = append(out, namedToken{name: name, digest: sha256.Sum256([]byte(tok))})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, errors.New("no tokens")
	}
	return out, nil
}

// author authenticates r and returns who made it: the token's name, or
// the client certificate's subject. errUnauthenticated (wrapped) when it
// cannot.
func (a *adminAuth) author(r *http.Request) (string, error) {
	if a.tokenFile != "" {
		_ = a.reload() // a file that cannot be used leaves no token
		given, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || given == "" {
			return "", fmt.Errorf("%w: send Authorization: Bearer <token>", errUnauthenticated)
		}
		d := sha256.Sum256([]byte(strings.TrimSpace(given)))
		a.mu.Lock()
		tokens := a.tokens
		a.mu.Unlock()
		name := ""
		for _, t := range tokens { // every token compared, in constant time
			if subtle.ConstantTimeCompare(d[:], t.digest[:]) == 1 {
				name = t.name
			}
		}
		if name == "" {
			return "", fmt.Errorf("%w: unknown token", errUnauthenticated)
		}
		return name, nil
	}
	if a.mtls && r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
		cert := r.TLS.VerifiedChains[0][0]
		if cn := cert.Subject.CommonName; cn != "" {
			return cn, nil
		}
		return cert.Subject.String(), nil
	}
	return "", fmt.Errorf("%w: no verified client certificate", errUnauthenticated)
}
