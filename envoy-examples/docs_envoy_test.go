package examples

import (
	"slices"
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	earlyhmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	"gopkg.in/yaml.v3"
)

// docYAML returns the first yaml block of the section of a doc that starts
// with heading.
func docYAML(t *testing.T, doc, heading string) any {
	t.Helper()
	_, section, ok := strings.Cut(repoFile(t, doc), heading)
	if !ok {
		t.Fatalf("%s: no section %q", doc, heading)
	}
	_, block, ok := strings.Cut(section, "```yaml\n")
	block, _, closed := strings.Cut(block, "```")
	if !ok || !closed {
		t.Fatalf("%s, %s: no yaml block", doc, heading)
	}
	var v any
	if err := yaml.Unmarshal([]byte(block), &v); err != nil {
		t.Fatalf("%s, %s: %v", doc, heading, err)
	}
	return v
}

// TestEmergencyActionDoc checks the rate_limits entry docs/operations.md
// gives for the emergency channel: one RateLimit of one request_headers
// action, valid for Envoy, sending the key its example flag names.
func TestEmergencyActionDoc(t *testing.T) {
	list, ok := docYAML(t, "docs/operations.md", "## The emergency channel").([]any)
	if !ok || len(list) != 1 {
		t.Fatalf("docs/operations.md, emergency channel: want a list of one rate_limits entry, got %v", list)
	}
	var rl routev3.RateLimit
	if err := unmarshalProto(list[0], &rl); err != nil {
		t.Fatalf("docs/operations.md, emergency channel: as a RateLimit: %v", err)
	}
	validateProto(t, "docs/operations.md emergency rate_limits entry", &rl)
	acts := rl.GetActions()
	if len(acts) != 1 || acts[0].GetRequestHeaders().GetDescriptorKey() != "emergency" || acts[0].GetRequestHeaders().GetSkipIfAbsent() {
		t.Errorf("emergency rate_limits entry %v: want one request_headers action to key emergency, not skipped when absent (an empty descriptor)", &rl)
	}
}

// TestGrayMarkerStripDoc checks the Envoy lines docs/config.md gives for
// stripping a client's gray header at the edge: they decode as
// HttpConnectionManager fields, pass Envoy's validation, and remove the
// header envoy.yaml's gray action reads.
func TestGrayMarkerStripDoc(t *testing.T) {
	v := docYAML(t, "docs/config.md", "### Gray requests")
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
