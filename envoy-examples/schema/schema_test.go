// Package schema decodes the deployment files of envoy-examples/ strictly
// into the upstream API types: Kubernetes objects into k8s.io/api (and the
// Prometheus Operator's and Gateway API's types), Istio objects into
// istio.io/api protos, the compose file with compose-go's loader. Any field
// the API does not define fails the test, and so does a value of the wrong
// shape (a quantity, an enum, a duration).
//
// It is a module of its own so that these heavy, test-only dependencies
// stay out of sluice's go.mod. The root module's envoy-examples tests check
// how the files fit together and against sluice itself; these check only
// that each file is what its API accepts.
package schema

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"google.golang.org/protobuf/encoding/protojson"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// kubeKind is how one kind decodes: the apiVersion its Go type belongs to,
// and a strict decoder into that type.
type kubeKind struct {
	gv     schema.GroupVersion
	decode func(doc []byte) error
}

// typed returns a kubeKind that decodes into a fresh T.
func typed[T any](gv schema.GroupVersion) kubeKind {
	return kubeKind{gv: gv, decode: func(doc []byte) error {
		var obj T
		return strictDecode(doc, &obj)
	}}
}

// strictDecode converts YAML to JSON and decodes it as the API server does
// with strict field validation (sigs.k8s.io/json): field names match
// case-sensitively, and unknown or duplicate fields are errors.
// sigs.k8s.io/yaml.UnmarshalStrict alone is not enough: through
// encoding/json it matches field names case-insensitively, so it accepts
// readOnlyRootFileSystem for readOnlyRootFilesystem, which a server
// refuses (strict) or drops (warn).
func strictDecode(doc []byte, out any) error {
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return err
	}
	strictErrs, err := kjson.UnmarshalStrict(js, out)
	if err != nil {
		return err
	}
	return errors.Join(strictErrs...)
}

// istioNetworking is the group version of Istio's networking API used here.
var istioNetworking = schema.GroupVersion{Group: "networking.istio.io", Version: "v1alpha3"}

// kinds are the kinds the examples may hold. A kind not listed fails.
var kinds = map[string]kubeKind{
	"Namespace":               typed[corev1.Namespace](corev1.SchemeGroupVersion),
	"ConfigMap":               typed[corev1.ConfigMap](corev1.SchemeGroupVersion),
	"Service":                 typed[corev1.Service](corev1.SchemeGroupVersion),
	"Deployment":              typed[appsv1.Deployment](appsv1.SchemeGroupVersion),
	"PodDisruptionBudget":     typed[policyv1.PodDisruptionBudget](policyv1.SchemeGroupVersion),
	"HorizontalPodAutoscaler": typed[autoscalingv2.HorizontalPodAutoscaler](autoscalingv2.SchemeGroupVersion),
	"ServiceMonitor":          typed[monitoringv1.ServiceMonitor](monitoringv1.SchemeGroupVersion),
	"Gateway":                 typed[gatewayv1.Gateway](gatewayv1.SchemeGroupVersion),
	"HTTPRoute":               typed[gatewayv1.HTTPRoute](gatewayv1.SchemeGroupVersion),
	"EnvoyFilter":             {gv: istioNetworking, decode: decodeEnvoyFilter},
}

// decodeEnvoyFilter decodes an EnvoyFilter: its metadata strictly into
// ObjectMeta, its spec (YAML converted to JSON) into istio.io/api's
// EnvoyFilter proto with protojson, unknown fields and enum values refused.
// Patch values are google.protobuf.Struct, so any mapping passes here; the
// root module's TestEnvoyFilters decodes them into Envoy's protos.
func decodeEnvoyFilter(doc []byte) error {
	var obj struct {
		metav1.TypeMeta   `json:",inline"`
		metav1.ObjectMeta `json:"metadata"`
		Spec              any `json:"spec"`
	}
	if err := strictDecode(doc, &obj); err != nil {
		return err
	}
	spec, err := yaml.Marshal(obj.Spec)
	if err != nil {
		return err
	}
	js, err := yaml.YAMLToJSON(spec)
	if err != nil {
		return err
	}
	var ef networkingv1alpha3.EnvoyFilter
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(js, &ef); err != nil {
		return fmt.Errorf("spec as istio.networking.v1alpha3.EnvoyFilter: %w", err)
	}
	return nil
}

// kubeFiles are the files of Kubernetes objects, relative to this
// directory: every YAML file of ../kubernetes and ../istio (and below).
func kubeFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	for _, root := range []string{"../kubernetes", "../istio"} {
		err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) {
				files = append(files, filepath.ToSlash(p))
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(files) < 6 {
		t.Fatalf("only %d files found: %q", len(files), files)
	}
	return files
}

// documents splits a multi-document YAML file; comment-only documents are
// dropped.
func documents(data []byte) ([][]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		var v any
		if err := yaml.Unmarshal(doc, &v); err != nil {
			return nil, err
		}
		if v != nil {
			docs = append(docs, doc)
		}
	}
}

// decodeFile decodes every document of a file of Kubernetes objects
// strictly, and returns the kinds found in order.
func decodeFile(name string, data []byte) ([]string, error) {
	docs, err := documents(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(docs) == 0 {
		return nil, fmt.Errorf("%s: no document", name)
	}
	var found []string
	for i, doc := range docs {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return found, fmt.Errorf("%s#%d: %w", name, i+1, err)
		}
		k, ok := kinds[tm.Kind]
		if !ok {
			return found, fmt.Errorf("%s#%d: kind %q has no schema here (add it to kinds)", name, i+1, tm.Kind)
		}
		if tm.APIVersion != k.gv.String() {
			return found, fmt.Errorf("%s#%d: %s apiVersion %q, want %q", name, i+1, tm.Kind, tm.APIVersion, k.gv)
		}
		if err := k.decode(doc); err != nil {
			return found, fmt.Errorf("%s#%d: %s: %w", name, i+1, tm.Kind, err)
		}
		found = append(found, tm.Kind)
	}
	return found, nil
}

// TestKubernetesObjectsStrict decodes every object of ../kubernetes and
// ../istio into its API type, unknown fields refused.
func TestKubernetesObjectsStrict(t *testing.T) {
	seen := make(map[string]bool)
	for _, f := range kubeFiles(t) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		found, err := decodeFile(f, data)
		if err != nil {
			t.Error(err)
		}
		for _, k := range found {
			seen[k] = true
		}
		t.Logf("%s: %q", f, found)
	}
	// Every kind of the table is used by some file, so none of its
	// decoders is dead code that a test of typos would miss.
	for k := range kinds {
		if !seen[k] {
			t.Errorf("no example holds a %s", k)
		}
	}
}

// typos are mistakes injected into a copy of a file: each must make the
// strict decode fail, with an error naming the culprit.
var typos = []struct {
	file, old, new string
	errHas         string
}{
	// The preStop sleep's field is seconds.
	{"../kubernetes/deployment.yaml", "seconds: 5", "secs: 5", "secs"},
	// topologySpreadConstraints take one topologyKey (topologyKeys was a
	// Service field, long removed).
	{"../kubernetes/deployment.yaml", "topologyKey: kubernetes.io/hostname", "topologyKeys: kubernetes.io/hostname", "topologyKeys"},
	// A resource quantity that does not parse.
	{"../kubernetes/deployment.yaml", "memory: 512Mi", "memory: 512MB", "quantities must match"},
	// Kubernetes spells it the American way.
	{"../kubernetes/hpa.yaml", "averageUtilization: 60", "averageUtilisation: 60", "averageUtilisation"},
	{"../kubernetes/pdb.yaml", "maxUnavailable: 1", "maxUnavailible: 1", "maxUnavailible"},
	{"../kubernetes/service.yaml", "appProtocol: grpc", "appProtocols: grpc", "appProtocols"},
	{"../kubernetes/servicemonitor.yaml", "scrapeTimeout: 10s", "scrape_timeout: 10s", "scrape_timeout"},
	{"../kubernetes/configmap.yaml", "data:", "datas:", "datas"},
	// The patch context is GATEWAY, an enum value.
	{"../istio/envoyfilter-ratelimit.yaml", "context: GATEWAY", "context: GATEWAYS", "GATEWAYS"},
	{"../istio/envoyfilter-ratelimit-actions.yaml", "workloadSelector:", "workloadSelecter:", "workloadSelecter"},
	{"../istio/envoyfilter-ratelimit.yaml", "operation: INSERT_BEFORE", "operation: INSERT_BEFOR", "INSERT_BEFOR"},
	{"../istio/gateway-api/gateway.yaml", "gatewayClassName: istio", "gatewayClass: istio", "gatewayClass"},
	{"../istio/gateway-api/gateway.yaml", "parentRefs:", "parentRef:", "parentRef"},
	{"../istio/gateway-api/envoyfilter-ratelimit.yaml", "targetRefs:", "targetRef:", "targetRef"},
	{"../istio/waypoint/envoyfilter-ratelimit.yaml", "context: WAYPOINT", "context: WAYPOINTS", "WAYPOINTS"},
	{"../istio/waypoint/waypoint.yaml", "protocol: HBONE", "protocols: HBONE", "protocols"},
	// Case matters to the API server; encoding/json alone would accept it.
	{"../istio/sluice.yaml", "readOnlyRootFilesystem: true", "readOnlyRootFileSystem: true", "readOnlyRootFileSystem"},
}

// TestStrictDecodeCatchesTypos shows that each check above fails on a
// typo: the file decodes as it is, and no longer once the typo is in.
func TestStrictDecodeCatchesTypos(t *testing.T) {
	for _, c := range typos {
		t.Run(c.file+"/"+c.new, func(t *testing.T) {
			data, err := os.ReadFile(c.file)
			if err != nil {
				t.Fatal(err)
			}
			if n := bytes.Count(data, []byte(c.old)); n < 1 {
				t.Fatalf("%s does not contain %q: the typo would not be injected", c.file, c.old)
			}
			if _, err := decodeFile(c.file, data); err != nil {
				t.Fatalf("unmodified: %v", err)
			}
			bad := bytes.Replace(data, []byte(c.old), []byte(c.new), 1)
			_, err = decodeFile(c.file, bad)
			if err == nil {
				t.Fatalf("%q → %q: decodes without error", c.old, c.new)
			}
			if !strings.Contains(err.Error(), c.errHas) {
				t.Errorf("%q → %q: error %q does not mention %q", c.old, c.new, err, c.errHas)
			}
			t.Logf("caught: %v", err)
		})
	}
}
