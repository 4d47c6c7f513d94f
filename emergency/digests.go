package emergency

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Digests is an immutable set of accepted secrets, as their SHA-256
// digests. The zero value and nil accept nothing.
type Digests struct {
	sums [][sha256.Size]byte
}

// errNoDigests is ParseDigests' error for a file without one digest.
var errNoDigests = errors.New("no digest: the file must hold at least one hex SHA-256 digest (to close the channel, restart without --emergency-key)")

// ParseDigests reads digests from data: one hex SHA-256 digest (64 hex
// digits, either case) per line; blank lines and everything from a '#' to
// the end of its line are ignored. A file without one digest is an error,
// so that a file caught empty mid-write never closes the channel. Errors
// name the line by its number only: a line that is no digest may be a
// secret pasted by mistake, and errors end up in logs.
func ParseDigests(data []byte) (*Digests, error) {
	d := &Digests{}
	var errs []error
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		var sum [sha256.Size]byte
		if len(line) != hex.EncodedLen(sha256.Size) {
			errs = append(errs, fmt.Errorf("line %d: not a SHA-256 digest: want %d hex digits, got %d characters", n, hex.EncodedLen(sha256.Size), len(line)))
			continue
		}
		if _, err := hex.Decode(sum[:], []byte(line)); err != nil {
			errs = append(errs, fmt.Errorf("line %d: not a SHA-256 digest: a character is no hex digit", n))
			continue
		}
		d.sums = append(d.sums, sum)
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, fmt.Errorf("reading digests: %w", err))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if len(d.sums) == 0 {
		return nil, errNoDigests
	}
	return d, nil
}

// Len returns the number of digests.
func (d *Digests) Len() int {
	if d == nil {
		return 0
	}
	return len(d.sums)
}

// Match reports whether secret is an accepted secret: whether its SHA-256
// digest is one of d's. It compares with every digest in constant time and
// without stopping at a match, so its timing tells neither which digest
// matched nor how much of one. An empty secret never matches.
func (d *Digests) Match(secret string) bool {
	if d == nil || secret == "" {
		return false
	}
	sum := sha256.Sum256([]byte(secret))
	found := 0
	for i := range d.sums {
		found |= subtle.ConstantTimeCompare(sum[:], d.sums[i][:])
	}
	return found == 1
}

// Digest returns the line for secret in a digests file: its SHA-256
// digest in lower-case hex, as `printf %s "$SECRET" | sha256sum` prints it.
func Digest(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}
