package flags_test

import (
	"io"
	"testing"

	"github.com/sluice-rls/sluice/cmd/rls/flags"
)

func TestAdaptiveConfigFlag(t *testing.T) {
	if st, err := flags.ParseServe(nil, noEnv, io.Discard); err != nil || st.AdaptiveConfig != "" {
		t.Errorf("default --adaptive-config %q, %v; want off", st.AdaptiveConfig, err)
	}
	if st, err := flags.ParseServe([]string{"--adaptive-config", "/a.yaml"}, noEnv, io.Discard); err != nil || st.AdaptiveConfig != "/a.yaml" {
		t.Errorf("--adaptive-config /a.yaml: %q, %v", st.AdaptiveConfig, err)
	}
	if st, err := flags.ParseServe(nil, envOf(map[string]string{"RLS_ADAPTIVE_CONFIG": "/e.yaml"}), io.Discard); err != nil || st.AdaptiveConfig != "/e.yaml" {
		t.Errorf("RLS_ADAPTIVE_CONFIG: %q, %v", st.AdaptiveConfig, err)
	}
}
