package flags_test

import (
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rls/sluice/cmd/rls/flags"
	"github.com/sluice-rls/sluice/override"
)

func TestOverrideFlags(t *testing.T) {
	st, err := flags.ParseServe(nil, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if st.Overrides.Resync != override.DefaultResync || st.Overrides.File != "" || st.Overrides.AdminTokenFile != "" || st.Overrides.MaxExpiry != 24*time.Hour {
		t.Errorf("override defaults: %+v, want resync %v, no files, max expiry 24h", st.Overrides, override.DefaultResync)
	}
	if st, err := flags.ParseServe([]string{"--override-max-expiry", "2h"}, noEnv, io.Discard); err != nil || st.Overrides.MaxExpiry != 2*time.Hour {
		t.Errorf("--override-max-expiry 2h: %v, %v", st.Overrides.MaxExpiry, err)
	}
	if st, err := flags.ParseServe([]string{"--override-max-expiry", "7d"}, noEnv, io.Discard); err != nil || st.Overrides.MaxExpiry != 7*24*time.Hour {
		t.Errorf("--override-max-expiry 7d: %v, %v", st.Overrides.MaxExpiry, err)
	}
	st, err = flags.ParseServe(nil, envOf(map[string]string{"RLS_ADMIN_TOKEN_FILE": "/t", "RLS_OVERRIDE_FILE": "/o"}), io.Discard)
	if err != nil || st.Overrides.AdminTokenFile != "/t" || st.Overrides.File != "/o" {
		t.Errorf("RLS_ADMIN_TOKEN_FILE, RLS_OVERRIDE_FILE: %+v, %v", st.Overrides, err)
	}
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--override-resync", "2s"}, "--override-resync must be in (0, 1s]"},
		{[]string{"--override-resync", "0s"}, "--override-resync must be in (0, 1s]"},
		{[]string{"--override-max-expiry", "0s"}, "--override-max-expiry must be positive"},
		{[]string{"--override-file", "/o", "--redis", "redis://127.0.0.1:1"}, "--override-file is for nodes without --redis"},
	} {
		if _, err := flags.ParseServe(tt.args, noEnv, io.Discard); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ParseServe(%q) = %v, want %q", tt.args, err, tt.want)
		}
	}
}
