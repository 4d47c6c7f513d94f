// Package charttest renders the sluice Helm chart with Helm's Go SDK (no
// cluster, no helm binary) and decodes every object strictly into its
// Kubernetes or Prometheus Operator type: a misspelt field fails.
package charttest

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

const (
	chartDir    = ".."
	releaseName = "sluice"
	namespace   = "rls"
)

// render renders the chart with vals (YAML over the chart's defaults) as
// `helm install sluice ../ --namespace rls` would, and returns the manifests
// by template path, NOTES.txt left out.
func render(t *testing.T, vals string) (map[string]string, error) {
	t.Helper()
	c, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	for _, f := range c.Files {
		if strings.HasPrefix(f.Name, "test/") {
			t.Fatalf("chart holds %s: .helmignore must leave out the test module", f.Name)
		}
	}
	user, err := chartutil.ReadValues([]byte(vals))
	if err != nil {
		t.Fatalf("values: %v", err)
	}
	rv, err := chartutil.ToRenderValues(c, user, chartutil.ReleaseOptions{
		Name: releaseName, Namespace: namespace, Revision: 1, IsInstall: true,
	}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, err
	}
	out, err := engine.Render(c, rv)
	if err != nil {
		return nil, err
	}
	for k := range out {
		if strings.HasSuffix(k, "NOTES.txt") {
			delete(out, k)
		}
	}
	return out, nil
}

// mustRender renders vals and fails the test on an error.
func mustRender(t *testing.T, vals string) map[string]string {
	t.Helper()
	out, err := render(t, vals)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	return out
}

// kinds maps each kind the chart may render to its apiVersion and a new value
// of its Go type. A kind missing here fails the test.
var kinds = map[string]struct {
	apiVersion string
	new        func() any
}{
	"ConfigMap":               {"v1", func() any { return new(corev1.ConfigMap) }},
	"Secret":                  {"v1", func() any { return new(corev1.Secret) }},
	"Service":                 {"v1", func() any { return new(corev1.Service) }},
	"ServiceAccount":          {"v1", func() any { return new(corev1.ServiceAccount) }},
	"Deployment":              {"apps/v1", func() any { return new(appsv1.Deployment) }},
	"HorizontalPodAutoscaler": {"autoscaling/v2", func() any { return new(autoscalingv2.HorizontalPodAutoscaler) }},
	"PodDisruptionBudget":     {"policy/v1", func() any { return new(policyv1.PodDisruptionBudget) }},
	"NetworkPolicy":           {"networking.k8s.io/v1", func() any { return new(networkingv1.NetworkPolicy) }},
	"ServiceMonitor":          {"monitoring.coreos.com/v1", func() any { return new(monitoringv1.ServiceMonitor) }},
	"PodMonitor":              {"monitoring.coreos.com/v1", func() any { return new(monitoringv1.PodMonitor) }},
	"PrometheusRule":          {"monitoring.coreos.com/v1", func() any { return new(monitoringv1.PrometheusRule) }},
}

// decodeStrict decodes one YAML document into the Go type of its kind as the
// API server's strict field validation does: unknown fields, duplicate keys
// and fields that match only case-insensitively are errors. (sigs.k8s.io/yaml's
// UnmarshalStrict goes through encoding/json, which matches field names
// case-insensitively and lets readOnlyRootFileSystem through; the API server
// would drop it. sigs.k8s.io/json, which the API server uses, does not.)
func decodeStrict(doc []byte) (kind string, obj any, err error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return "", nil, err
	}
	k, ok := kinds[tm.Kind]
	if !ok {
		return "", nil, fmt.Errorf("unexpected kind %q", tm.Kind)
	}
	if tm.APIVersion != k.apiVersion {
		return "", nil, fmt.Errorf("%s: apiVersion %q, want %q", tm.Kind, tm.APIVersion, k.apiVersion)
	}
	obj = k.new()
	j, err := yaml.YAMLToJSONStrict(doc) // duplicate keys are errors
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	strict, err := kjson.UnmarshalStrict(j, obj, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	if err == nil {
		err = errors.Join(strict...)
	}
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	return tm.Kind, obj, nil
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

// splitDocs returns the non-empty YAML documents of a manifest.
func splitDocs(manifest string) [][]byte {
	var docs [][]byte
	for _, d := range docSep.Split(manifest, -1) {
		j, err := yaml.YAMLToJSON([]byte(d))
		if err == nil && (bytes.Equal(j, []byte("null")) || len(bytes.TrimSpace(j)) == 0) {
			continue // comments or whitespace only
		}
		docs = append(docs, []byte(d))
	}
	return docs
}

// objects is one rendering, decoded.
type objects struct {
	ConfigMaps      []*corev1.ConfigMap
	Secrets         []*corev1.Secret
	Services        []*corev1.Service
	ServiceAccounts []*corev1.ServiceAccount
	Deployments     []*appsv1.Deployment
	HPAs            []*autoscalingv2.HorizontalPodAutoscaler
	PDBs            []*policyv1.PodDisruptionBudget
	NetworkPolicies []*networkingv1.NetworkPolicy
	ServiceMonitors []*monitoringv1.ServiceMonitor
	PodMonitors     []*monitoringv1.PodMonitor
	PrometheusRules []*monitoringv1.PrometheusRule
	names           []string // kind/name, sorted
}

var dnsName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// decodeAll strictly decodes every rendered object, checking that each is
// named, in the release namespace, and unique by kind and name.
func decodeAll(t *testing.T, out map[string]string) *objects {
	t.Helper()
	o := &objects{}
	seen := map[string]bool{}
	paths := make([]string, 0, len(out))
	for p := range out {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		for _, doc := range splitDocs(out[p]) {
			kind, obj, err := decodeStrict(doc)
			if err != nil {
				t.Fatalf("%s: %v\n%s", p, err, doc)
			}
			m := obj.(metav1.ObjectMetaAccessor).GetObjectMeta()
			key := kind + "/" + m.GetName()
			if !dnsName.MatchString(m.GetName()) || len(m.GetName()) > 63 {
				t.Errorf("%s: name %q is not a DNS label", p, m.GetName())
			}
			if m.GetNamespace() != namespace {
				t.Errorf("%s: %s in namespace %q, want %q", p, key, m.GetNamespace(), namespace)
			}
			if seen[key] {
				t.Errorf("%s: %s rendered twice", p, key)
			}
			seen[key] = true
			o.names = append(o.names, key)
			switch v := obj.(type) {
			case *corev1.ConfigMap:
				o.ConfigMaps = append(o.ConfigMaps, v)
			case *corev1.Secret:
				o.Secrets = append(o.Secrets, v)
			case *corev1.Service:
				o.Services = append(o.Services, v)
			case *corev1.ServiceAccount:
				o.ServiceAccounts = append(o.ServiceAccounts, v)
			case *appsv1.Deployment:
				o.Deployments = append(o.Deployments, v)
			case *autoscalingv2.HorizontalPodAutoscaler:
				o.HPAs = append(o.HPAs, v)
			case *policyv1.PodDisruptionBudget:
				o.PDBs = append(o.PDBs, v)
			case *networkingv1.NetworkPolicy:
				o.NetworkPolicies = append(o.NetworkPolicies, v)
			case *monitoringv1.ServiceMonitor:
				o.ServiceMonitors = append(o.ServiceMonitors, v)
			case *monitoringv1.PodMonitor:
				o.PodMonitors = append(o.PodMonitors, v)
			case *monitoringv1.PrometheusRule:
				o.PrometheusRules = append(o.PrometheusRules, v)
			}
		}
	}
	sort.Strings(o.names)
	return o
}
