package node

import (
	"net/http"
	"strings"
	"testing"
)

// TestPublicMuxSaysWhereAdminPathsAre: /json, /usage, /usage/top and
// /overrides on the HTTP address answer 404 naming the admin address, or
// saying it is off.
func TestPublicMuxSaysWhereAdminPathsAre(t *testing.T) {
	for _, admin := range []string{"127.0.0.1:0", ""} {
		opts := testOptions()
		opts.AdminAddr = admin
		rls := start(t, opts)
		want := "is served on the admin address 127.0.0.1:0 (--admin-addr)"
		if admin == "" {
			want = "is served on the admin address, which is off (--admin-addr is empty)"
		}
		for _, path := range []string{"/json", "/usage?domain=edge&descriptor=user_id%3Da", "/usage/top", "/overrides"} {
			if code, body := httpGet(t, rls.HTTP()+path); code != http.StatusNotFound || !strings.Contains(body, want) {
				t.Errorf("admin address %q: %s on the HTTP address: %d %q, want 404 %q", admin, path, code, body, want)
			}
		}
		rls.StopCleanly()
	}
}
