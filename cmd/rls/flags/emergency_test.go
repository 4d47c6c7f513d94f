package flags_test

import (
	"io"
	"strings"
	"testing"

	"github.com/sluice-rls/sluice/cmd/rls/flags"
	"github.com/sluice-rls/sluice/node"
)

// TestServeEmergencyFlags: the channel is off by default; its two flags
// go together (also from RLS_*), and its key cannot be the gray key.
func TestServeEmergencyFlags(t *testing.T) {
	st, err := flags.ParseServe(nil, noEnv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if st.Emergency != (node.Emergency{}) {
		t.Errorf("emergency defaults %+v, want the channel off", st.Emergency)
	}
	st, err = flags.ParseServe([]string{"--emergency-key", "emergency"},
		envOf(map[string]string{"RLS_EMERGENCY_SECRET_FILE": "/etc/sluice/emergency/digests"}), io.Discard)
	if err != nil || st.Emergency != (node.Emergency{Key: "emergency", SecretFile: "/etc/sluice/emergency/digests"}) {
		t.Errorf("--emergency-key with RLS_EMERGENCY_SECRET_FILE: %+v, %v", st.Emergency, err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--emergency-key", "emergency"}, "--emergency-key needs --emergency-secret-file"},
		{[]string{"--emergency-secret-file", "/x"}, "--emergency-secret-file needs --emergency-key"},
		{[]string{"--emergency-key", "gray", "--emergency-secret-file", "/x"}, `--emergency-key and --gray-key are both "gray"`},
	} {
		_, err := flags.ParseServe(c.args, noEnv, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseServe(%q) error %v, want %q", c.args, err, c.want)
		}
	}
}
