package examples

import (
	"slices"
	"strings"
	"testing"

	earlyhmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"gopkg.in/yaml.v3"
)

// TestGrayMarkerStripDoc checks the Envoy lines docs/config.md gives for
// stripping a client's gray header at the edge: they decode as
// HttpConnectionManager fields, pass Envoy's validation, and remove the
// header envoy.yaml's gray action reads.
func TestGrayMarkerStripDoc(t *testing.T) {
	_, section, ok := strings.Cut(repoFile(t, "docs/config.md"), "### Gray requests")
	if !ok {
		t.Fatal(`docs/config.md: no section "### Gray requests"`)
	}
	_, block, ok := strings.Cut(section, "```yaml\n")
	block, _, closed := strings.Cut(block, "```")
	if !ok || !closed {
		t.Fatal("docs/config.md, Gray requests: no yaml block")
	}
	var v any
	if err := yaml.Unmarshal([]byte(block), &v); err != nil {
		t.Fatalf("docs/config.md, Gray requests: %v", err)
	}
	var hcm hcmv3.HttpConnectionManager
	if err := unmarshalProto(v, &hcm); err != nil {
		t.Fatalf("docs/config.md, Gray requests: as HttpConnectionManager fields: %v", err)
	}
	var removed []string
	for _, ext := range hcm.GetEarlyHeaderMutationExtensions() {
		validateProto(t, "docs/config.md early_header_mutation_extensions", ext)
		var hm earlyhmv3.HeaderMutation
		if err := ext.GetTypedConfig().UnmarshalTo(&hm); err != nil {
			t.Fatalf("%s: %v", ext.GetName(), err)
		}
		for _, m := range hm.GetMutations() {
			if r := m.GetRemove(); r != "" {
				removed = append(removed, r)
			}
		}
	}
	var grayHeaders []string
	for _, rl := range envoyRateLimits(t, loadBootstrap(t)) {
		for _, a := range rl.GetActions() {
			if hv := a.GetHeaderValueMatch(); hv != nil && hv.GetDescriptorKey() == grayKey {
				for _, h := range hv.GetHeaders() {
					grayHeaders = append(grayHeaders, h.GetName())
				}
			}
		}
	}
	if len(grayHeaders) == 0 {
		t.Fatal("envoy.yaml: no header_value_match action sends the gray key")
	}
	for _, h := range grayHeaders {
		if !slices.Contains(removed, h) {
			t.Errorf("docs/config.md strips %q, not %q, the header envoy.yaml marks gray requests by", removed, h)
		}
	}
}
