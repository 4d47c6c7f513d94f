package emergency_test

import (
	"strings"
	"testing"

	"github.com/sluice-rls/sluice/emergency"
)

func TestParseDigests(t *testing.T) {
	a, b := emergency.Digest("alpha"), emergency.Digest("bravo")
	for _, c := range []struct {
		name    string
		file    string
		want    int
		wantErr string
	}{
		{"one", a + "\n", 1, ""},
		{"comments and blanks", "# rotation 2026-12\n\n  " + strings.ToUpper(a) + "  # old\n" + b, 2, ""},
		{"empty", "", 0, "no digest"},
		{"only comments", "# nothing yet\n", 0, "no digest"},
		{"short line", a + "\n" + a[:10] + "\n", 0, "line 2: not a SHA-256 digest: want 64 hex digits, got 10 characters"},
		{"not hex", strings.Repeat("z", 64), 0, "line 1: not a SHA-256 digest: a character is no hex digit"},
		{"plain secret pasted", "hunter2-the-secret\n", 0, "line 1: not a SHA-256 digest"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d, err := emergency.ParseDigests([]byte(c.file))
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("ParseDigests(%q) error %v, want one containing %q", c.file, err, c.wantErr)
				}
				if strings.Contains(err.Error(), "hunter2") {
					t.Errorf("error %q repeats the line", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseDigests(%q): %v", c.file, err)
			}
			if d.Len() != c.want {
				t.Errorf("ParseDigests(%q) has %d digests, want %d", c.file, d.Len(), c.want)
			}
		})
	}
}

func TestDigestsMatch(t *testing.T) {
	d, err := emergency.ParseDigests([]byte(emergency.Digest("alpha") + "\n" + emergency.Digest("bravo") + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	for secret, want := range map[string]bool{
		"alpha": true, "bravo": true, // either line of an overlapping rotation
		"charlie": false, "alph": false, "alpha ": false, "": false,
		emergency.Digest("alpha"): false, // the digest is no secret
	} {
		if got := d.Match(secret); got != want {
			t.Errorf("Match(%q) = %v, want %v", secret, got, want)
		}
	}
	var none *emergency.Digests
	if none.Match("alpha") || none.Len() != 0 {
		t.Errorf("nil Digests: Match %v Len %d, want false 0", none.Match("alpha"), none.Len())
	}
}

// TestDigestMatchesSha256sum: the line Digest prints is what
// `printf %s SECRET | sha256sum` prints, the command docs/operations.md gives.
func TestDigestMatchesSha256sum(t *testing.T) {
	const want = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824" // sha256("hello")
	if got := emergency.Digest("hello"); got != want {
		t.Errorf("Digest(hello) = %s, want %s", got, want)
	}
}
