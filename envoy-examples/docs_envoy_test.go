package examples

import (
	"slices"
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	earlyhmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/http/early_header_mutation/header_mutation/v3"
	"gopkg.in/yaml.v3"

	"github.com/sluice-rls/sluice/descriptors"
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

// TestUsageQuotaDoc checks the section of docs/config.md on usage-based
// quotas: its rule file loads with a postpaid rule, and its Envoy rate
// limits decode and pass Envoy's validation as a route's
// typed_per_filter_config, a check of hits_addend 0 and a charge on stream
// done whose hits_addend comes from a format, both on the rule's key.
func TestUsageQuotaDoc(t *testing.T) {
	const heading = "## Usage-based quotas"
	_, section, ok := strings.Cut(repoFile(t, "docs/config.md"), heading)
	if !ok {
		t.Fatalf("docs/config.md: no section %q", heading)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	var blocks []string
	for {
		var block string
		if _, section, ok = strings.Cut(section, "```yaml\n"); !ok {
			break
		}
		block, section, _ = strings.Cut(section, "```")
		blocks = append(blocks, block)
	}
	if len(blocks) != 2 {
		t.Fatalf("docs/config.md, %s: %d yaml blocks, want 2 (the rules, Envoy's rate limits)", heading, len(blocks))
	}

	f, err := descriptors.Parse("config.md", []byte(blocks[0]))
	if err != nil {
		t.Fatalf("the rule file: %v", err)
	}
	cfg, err := descriptors.New([]*descriptors.File{f}, descriptors.Options{})
	if err != nil {
		t.Fatalf("the rule file: %v", err)
	}
	r := cfg.Domain("llm").Match([]descriptors.Entry{{Key: "tenant", Value: "t"}})
	if r == nil || !r.Postpaid {
		t.Fatalf("the rule file: tenant matches %v, want a postpaid rule", r)
	}

	var v any
	if err := yaml.Unmarshal([]byte(blocks[1]), &v); err != nil {
		t.Fatalf("Envoy's block: %v", err)
	}
	route := map[string]any{"match": map[string]any{"prefix": "/"}, "route": map[string]any{"cluster": "llm"}, "typed_per_filter_config": v}
	var rt routev3.Route
	if err := unmarshalProto(route, &rt); err != nil {
		t.Fatalf("Envoy's block as a route's typed_per_filter_config: %v", err)
	}
	validateProto(t, "docs/config.md usage-based quota route", &rt)
	var per ratelimitfilterv3.RateLimitPerRoute
	if err := rt.GetTypedPerFilterConfig()["envoy.filters.http.ratelimit"].UnmarshalTo(&per); err != nil {
		t.Fatalf("envoy.filters.http.ratelimit: %v", err)
	}
	rls := per.GetRateLimits()
	if len(rls) != 2 {
		t.Fatalf("%d rate limits, want 2", len(rls))
	}
	check, charge := rls[0], rls[1]
	for _, rl := range rls {
		if a := rl.GetActions(); len(a) != 1 || a[0].GetRequestHeaders().GetDescriptorKey() != "tenant" {
			t.Errorf("rate limit %v: want one action to descriptor key tenant, the rule's", rl)
		}
	}
	if check.GetApplyOnStreamDone() || check.GetHitsAddend().GetNumber() == nil || check.GetHitsAddend().GetNumber().GetValue() != 0 {
		t.Errorf("check %v: want hits_addend number 0 on the request path", check)
	}
	if !charge.GetApplyOnStreamDone() || !strings.HasPrefix(charge.GetHitsAddend().GetFormat(), "%DYNAMIC_METADATA(") {
		t.Errorf("charge %v: want apply_on_stream_done and a hits_addend format from dynamic metadata", charge)
	}
}
