package charttest

import (
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// renderedDoc returns the one document of template file name in the
// rendering with the example rules.
func renderedDoc(t *testing.T, name string) []byte {
	t.Helper()
	out := mustRender(t, "rules: {examples: true}")
	docs := splitDocs(out["sluice/templates/"+name])
	if len(docs) != 1 {
		t.Fatalf("%s: %d documents", name, len(docs))
	}
	return docs[0]
}

// inject decodes doc, lets edit change it, and encodes it again.
func inject(t *testing.T, doc []byte, edit func(m map[string]any)) []byte {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal(doc, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	b, err := yaml.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func get(m map[string]any, path ...any) any {
	var v any = m
	for _, p := range path {
		switch k := p.(type) {
		case string:
			v = v.(map[string]any)[k]
		case int:
			v = v.([]any)[k]
		}
	}
	return v
}

// TestStrictDecodeRejectsTypos: a misspelt field in a rendered object fails
// the decode (a lenient decode would drop it and Kubernetes would ignore it),
// while the object as rendered, and as re-encoded unchanged, decodes.
func TestStrictDecodeRejectsTypos(t *testing.T) {
	cases := []struct {
		file, field string
		edit        func(m map[string]any)
	}{
		{"hpa.yaml", "averageUtilisation", func(m map[string]any) {
			get(m, "spec", "metrics", 0, "resource", "target").(map[string]any)["averageUtilisation"] = 60
		}},
		{"deployment.yaml", "topologyKeys", func(m map[string]any) {
			get(m, "spec", "template", "spec", "topologySpreadConstraints", 0).(map[string]any)["topologyKeys"] = []any{"kubernetes.io/hostname"}
		}},
		{"deployment.yaml", "readOnlyRootFileSystem", func(m map[string]any) {
			get(m, "spec", "template", "spec", "containers", 0, "securityContext").(map[string]any)["readOnlyRootFileSystem"] = true
		}},
		{"pdb.yaml", "maxUnavailible", func(m map[string]any) {
			get(m, "spec").(map[string]any)["maxUnavailible"] = 1
		}},
		{"service.yaml", "clusterIp", func(m map[string]any) {
			get(m, "spec").(map[string]any)["clusterIp"] = "None"
		}},
	}
	for _, tc := range cases {
		t.Run(tc.file+"/"+tc.field, func(t *testing.T) {
			doc := renderedDoc(t, tc.file)
			if _, _, err := decodeStrict(doc); err != nil {
				t.Fatalf("as rendered: %v", err)
			}
			if _, _, err := decodeStrict(inject(t, doc, func(map[string]any) {})); err != nil {
				t.Fatalf("re-encoded unchanged: %v", err)
			}
			_, _, err := decodeStrict(inject(t, doc, tc.edit))
			if err == nil || !strings.Contains(err.Error(), "unknown field") || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("with %s: err = %v, want an unknown field %q", tc.field, err, tc.field)
			}
		})
	}

	// A ServiceMonitor too (a CRD type, decoded into monitoringv1).
	out := mustRender(t, "rules: {examples: true}\nmetrics: {serviceMonitor: {enabled: true}}")
	doc := splitDocs(out["sluice/templates/servicemonitor.yaml"])[0]
	bad := inject(t, doc, func(m map[string]any) {
		get(m, "spec", "endpoints", 0).(map[string]any)["scrapeInterval"] = "15s"
	})
	if _, _, err := decodeStrict(bad); err == nil || !strings.Contains(err.Error(), "scrapeInterval") {
		t.Errorf("ServiceMonitor with scrapeInterval: err = %v", err)
	}
	// And a duplicate key.
	dup := strings.Replace(string(renderedDoc(t, "pdb.yaml")), "  maxUnavailable: 1\n", "  maxUnavailable: 1\n  maxUnavailable: 2\n", 1)
	if _, _, err := decodeStrict([]byte(dup)); err == nil {
		t.Errorf("duplicate maxUnavailable accepted")
	}
}

// TestRenderRefuses: value combinations that would make a broken release
// fail to render, with a message naming the value.
func TestRenderRefuses(t *testing.T) {
	for _, tc := range []struct{ vals, msg string }{
		{"", "sluice needs rules: set rules.files, rules.existingConfigMap or xds.server"},
		{"rules: {examples: false}\nredis: {url: 'redis://redis:6379/0'}", "sluice needs rules"},
		{"rules: {examples: true, existingConfigMap: mine}", "give one source of rules, not rules.existingConfigMap and rules.examples"},
		{"rules: {files: {a.yaml: 'domain: a'}}\nxds: {server: 'cp:18001'}", "give one source of rules, not rules.files and xds.server"},
		{"xds: {nodeID: envoy-ratelimit}\nrules: {examples: true}", "xds.nodeID needs xds.server"},
		{"rules: {examples: true}\nmetrics: {serviceMonitor: {enabled: true}, podMonitor: {enabled: true}}", "choose one"},
		{"rules: {examples: true}\ntls: {enabled: true}", "tls.secretName"},
		{"rules: {examples: true}\ntls: {enabled: false, clientCA: {enabled: true, secretName: ca}}", "needs tls.enabled"},
		{"rules: {examples: true}\ntls: {enabled: true, secretName: s, clientCA: {enabled: true}}", "tls.clientCA.secretName"},
		{"rules: {examples: true}\ntls: {enabled: true, secretName: s}\nprobes: {type: grpc}", "gRPC probe has no TLS"},
		{"rules: {examples: true}\nprobes: {type: tcp}", "probes/type"},
		{"rules: {examples: true}\nnetworkPolicy: {enabled: true, grpcFrom: []}", "must not be empty"},
		{"rules: {examples: true}\nnetworkPolicy: {enabled: true, httpFrom: []}", "must not be empty"},
		{"rules: {files: {edge.yml: 'domain: edge'}}", "must end in .yaml"},
		{"rules: {examples: true}\nautoscaling: {minReplicas: 5, maxReplicas: 3}", "maxReplicas must be at least"},
		{"rules: {examples: true}\nautoscaling: {enabled: false}\nreplicaCount: 0", "replicaCount"},
		{"rules: {examples: true}\nglobalLayer: {share: 0.5}", "globalLayer.share needs Redis: set redis.url, redis.existingSecret.name or redis.bundled.enabled"},
		{"rules: {examples: true}\nglobalLayer: {share: 0}", "globalLayer.share needs Redis"},
		{"rules: {examples: true}\nglobalLayer: {consistency: leased}", "globalLayer.consistency needs Redis"},
		{"rules: {examples: true}\nglobalLayer: {leasePeriod: 2s}", "sluice ignores --lease-period"},
		{"rules: {examples: true}\nadaptive: {config: {prometheus: 'http://p'}, existingConfigMap: {name: mine}}", "give one source of adaptive limits, not adaptive.config and adaptive.existingConfigMap.name"},
	} {
		_, err := render(t, tc.vals)
		if err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: err = %v, want %q", tc.vals, err, tc.msg)
		}
	}
}
