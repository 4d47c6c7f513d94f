package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
)

// minTokenBytes is the shortest bearer token --admin-token-file accepts:
// a guessable token would open the door the endpoint guards.
const minTokenBytes = 16

// adminAuth authenticates the calls of the admin endpoints that change
// state (/overrides). With --admin-token-file a call needs
// "Authorization: Bearer <token>" of one of its tokens, and its author is
// that token's name. Without it, with --tls-client-ca, the admin listener
// already requires a verified client certificate, and the author is its
// subject. With neither, nothing is authenticated and the endpoints are
// not served.
type adminAuth struct {
	tokenFile string
	mtls      bool

	mu     sync.Mutex
	tokens []namedToken
}

// namedToken is one line of the token file, the token kept as its digest
// so that comparisons take the same time whatever it is.
type namedToken struct {
	name   string
	digest [sha256.Size]byte
}

// errUnauthenticated is the reason a call is refused with 401.
var errUnauthenticated = errors.New("unauthenticated")

// newAdminAuth returns the authentication of --admin-token-file and
// --tls-client-ca. A token file that cannot be read or holds no valid
// token is an error at start; later, a broken rewrite keeps the tokens
// last read.
func newAdminAuth(tokenFile string, mtls bool) (*adminAuth, error) {
	a := &adminAuth{tokenFile: tokenFile, mtls: mtls}
	if tokenFile != "" {
		if err := a.reload(); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// enabled reports whether any authentication is configured.
func (a *adminAuth) enabled() bool { return a.tokenFile != "" || a.mtls }

// reload re-reads the token file. It runs on every authenticated call:
// admin calls are rare, and a file read (unlike a modification time)
// never misses a rewrite.
func (a *adminAuth) reload() error {
	data, err := os.ReadFile(a.tokenFile)
	if err != nil {
		return fmt.Errorf("--admin-token-file: %w", err)
	}
	tokens, err := parseTokens(data)
	if err != nil {
		return fmt.Errorf("--admin-token-file %s: %w", a.tokenFile, err)
	}
	a.mu.Lock()
	a.tokens = tokens
	a.mu.Unlock()
	return nil
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
		_ = a.reload() // a broken rewrite keeps the tokens last read
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
