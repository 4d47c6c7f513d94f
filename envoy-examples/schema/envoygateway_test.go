package schema

import (
	"os"
	"regexp"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	"sigs.k8s.io/yaml"
)

// yamlBlock matches a fenced YAML block of a Markdown file.
var yamlBlock = regexp.MustCompile("(?ms)^```yaml\n(.*?)^```")

// TestEnvoyGatewayDocDecodes decodes every YAML block of
// docs/envoy-gateway.md strictly into Envoy Gateway's API types: the
// EnvoyGateway configuration (rateLimitDeployment, the rate-limit backend)
// and the BackendTrafficPolicy. A field Envoy Gateway does not define, or
// a value of the wrong shape, fails.
func TestEnvoyGatewayDocDecodes(t *testing.T) {
	b, err := os.ReadFile("../../docs/envoy-gateway.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := yamlBlock.FindAllSubmatch(b, -1)
	if len(blocks) == 0 {
		t.Fatal("no YAML block")
	}
	seen := map[string]int{}
	for i, m := range blocks {
		doc := m[1]
		var head struct{ APIVersion, Kind string }
		if err := yaml.Unmarshal(doc, &head); err != nil {
			t.Fatalf("block %d: %v", i+1, err)
		}
		if head.APIVersion != egv1a1.GroupVersion.String() {
			t.Errorf("block %d: apiVersion %q, want %s", i+1, head.APIVersion, egv1a1.GroupVersion)
		}
		seen[head.Kind]++
		switch head.Kind {
		case egv1a1.KindEnvoyGateway:
			var eg egv1a1.EnvoyGateway
			if err := strictDecode(doc, &eg); err != nil {
				t.Errorf("block %d (EnvoyGateway): %v", i+1, err)
				continue
			}
			// The swap: the rate-limit Deployment's image is set.
			k := eg.Provider.Kubernetes
			if k == nil || k.RateLimitDeployment == nil || k.RateLimitDeployment.Container == nil || k.RateLimitDeployment.Container.Image == nil {
				t.Errorf("block %d: no provider.kubernetes.rateLimitDeployment.container.image", i+1)
			}
		case egv1a1.KindBackendTrafficPolicy:
			var p egv1a1.BackendTrafficPolicy
			if err := strictDecode(doc, &p); err != nil {
				t.Errorf("block %d (BackendTrafficPolicy): %v", i+1, err)
				continue
			}
			if p.Spec.RateLimit == nil || p.Spec.RateLimit.Global == nil || len(p.Spec.RateLimit.Global.Rules) == 0 {
				t.Errorf("block %d: no global rate-limit rule", i+1)
			}
		default:
			t.Errorf("block %d: kind %q, want EnvoyGateway or BackendTrafficPolicy", i+1, head.Kind)
		}
	}
	if seen[egv1a1.KindEnvoyGateway] == 0 || seen[egv1a1.KindBackendTrafficPolicy] == 0 {
		t.Errorf("kinds %v: want both an EnvoyGateway and a BackendTrafficPolicy", seen)
	}
}
