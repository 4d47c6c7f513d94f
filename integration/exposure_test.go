//go:build integration

package integration

import (
	"strings"
	"testing"
)

// TestPprofCmdlineHidesSecrets starts with a Redis password on the command
// line and --pprof: no pprof page may show it.
func TestPprofCmdlineHidesSecrets(t *testing.T) {
	const secret = "s3cret-in-argv"
	p := startRLS(t, "--pprof", "--redis", "redis://:"+secret+"@127.0.0.1:1/0", "--fallback-nodes", "1")
	for _, path := range []string{"/debug/pprof/cmdline", "/debug/pprof/", "/debug/pprof/cmdline?debug=1"} {
		_, body := p.HTTPGet(t, path)
		if strings.Contains(body, secret) {
			t.Errorf("GET %s shows the password from the command line:\n%.500s", path, body)
		}
	}
	if code, _ := p.HTTPGet(t, "/debug/pprof/cmdline"); code != 404 {
		t.Errorf("/debug/pprof/cmdline: %d, want 404", code)
	}
	// pprof itself is still served.
	if code, body := p.HTTPGet(t, "/debug/pprof/"); code != 200 || !strings.Contains(body, "goroutine") {
		t.Errorf("/debug/pprof/: %d", code)
	}
}
