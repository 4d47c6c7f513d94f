package charttest

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"sigs.k8s.io/yaml"
)

// plainObjects strictly decodes envoy-examples/kubernetes/*.yaml.
func plainObjects(t *testing.T) map[string]any {
	t.Helper()
	files, err := filepath.Glob("../../../envoy-examples/kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no plain manifests: %v", err)
	}
	objs := map[string]any{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range splitDocs(string(b)) {
			kind, obj, err := decodeStrict(doc)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			objs[kind] = obj
		}
	}
	return objs
}

func diff(t *testing.T, what string, got, want any) {
	t.Helper()
	if !equality.Semantic.DeepEqual(got, want) {
		g, _ := yaml.Marshal(got)
		w, _ := yaml.Marshal(want)
		t.Errorf("%s differs from envoy-examples/kubernetes:\nchart:\n%s\nplain:\n%s", what, g, w)
	}
}

// plainValues are the values beyond the defaults that the plain manifests
// have: their example rules, their Redis, their ServiceMonitor.
const plainValues = "rules: {examples: true}\nredis: {url: 'redis://redis:6379/0'}\nmetrics: {serviceMonitor: {enabled: true}}"

// TestDefaultsMatchPlainManifests: with release name sluice, the default
// values and plainValues, the chart renders the objects of
// envoy-examples/kubernetes/, with these differences only: selectors add
// app.kubernetes.io/instance; the Redis URL is RLS_REDIS from a Secret
// instead of --redis; GOMEMLIMIT is set from the memory limit; the pods run
// as a ServiceAccount of their own, repeat runAsUser on the container, and
// also spread over zones.
func TestDefaultsMatchPlainManifests(t *testing.T) {
	plain := plainObjects(t)
	for _, k := range []string{"ConfigMap", "Service", "Deployment", "HorizontalPodAutoscaler", "PodDisruptionBudget", "ServiceMonitor"} {
		if plain[k] == nil {
			t.Fatalf("no %s among the plain manifests", k)
		}
	}
	o := decodeAll(t, mustRender(t, plainValues))

	// Rules: the same files.
	diff(t, "ConfigMap data", o.ConfigMaps[0].Data, plain["ConfigMap"].(*corev1.ConfigMap).Data)

	// HPA: the same spec.
	diff(t, "HPA spec", o.HPAs[0].Spec, plain["HorizontalPodAutoscaler"].(*autoscalingv2.HorizontalPodAutoscaler).Spec)

	// PDB: the same budget; the chart's selector narrows the plain one.
	pp := plain["PodDisruptionBudget"].(*policyv1.PodDisruptionBudget).Spec
	cp := o.PDBs[0].Spec
	diff(t, "PDB maxUnavailable", cp.MaxUnavailable, pp.MaxUnavailable)
	wantNarrower(t, "PDB selector", cp.Selector.MatchLabels, pp.Selector.MatchLabels)

	// Service: the same ports and headlessness.
	ps := plain["Service"].(*corev1.Service).Spec
	cs := o.service(releaseName).Spec
	diff(t, "Service ports", cs.Ports, ps.Ports)
	if cs.ClusterIP != ps.ClusterIP {
		t.Errorf("Service clusterIP %q, plain %q", cs.ClusterIP, ps.ClusterIP)
	}
	wantNarrower(t, "Service selector", cs.Selector, ps.Selector)

	// ServiceMonitor: the same endpoints.
	diff(t, "ServiceMonitor endpoints", o.ServiceMonitors[0].Spec.Endpoints, plain["ServiceMonitor"].(*monitoringv1.ServiceMonitor).Spec.Endpoints)

	// Deployment.
	pd := plain["Deployment"].(*appsv1.Deployment)
	cd, cc := o.sluice(t)
	wantNarrower(t, "Deployment selector", cd.Spec.Selector.MatchLabels, pd.Spec.Selector.MatchLabels)
	diff(t, "Deployment strategy", cd.Spec.Strategy, pd.Spec.Strategy)
	diff(t, "revisionHistoryLimit", cd.Spec.RevisionHistoryLimit, pd.Spec.RevisionHistoryLimit)
	diff(t, "replicas", cd.Spec.Replicas, pd.Spec.Replicas)
	pps, cps := pd.Spec.Template.Spec, cd.Spec.Template.Spec
	diff(t, "pod securityContext", cps.SecurityContext, pps.SecurityContext)
	diff(t, "terminationGracePeriodSeconds", cps.TerminationGracePeriodSeconds, pps.TerminationGracePeriodSeconds)
	diff(t, "automountServiceAccountToken", cps.AutomountServiceAccountToken, pps.AutomountServiceAccountToken)
	diff(t, "volumes", cps.Volumes, pps.Volumes)
	for _, ptsc := range pps.TopologySpreadConstraints {
		i := slices.IndexFunc(cps.TopologySpreadConstraints, func(c corev1.TopologySpreadConstraint) bool { return c.TopologyKey == ptsc.TopologyKey })
		if i < 0 {
			t.Errorf("no topology spread on %s", ptsc.TopologyKey)
			continue
		}
		ctsc := cps.TopologySpreadConstraints[i]
		if ctsc.MaxSkew != ptsc.MaxSkew || ctsc.WhenUnsatisfiable != ptsc.WhenUnsatisfiable {
			t.Errorf("topology spread on %s: %+v, plain %+v", ptsc.TopologyKey, ctsc, ptsc)
		}
	}
	pc := pps.Containers[0]
	c := *cc
	diff(t, "image", c.Image, pc.Image)
	diff(t, "ports", c.Ports, pc.Ports)
	diff(t, "readinessProbe", c.ReadinessProbe, pc.ReadinessProbe)
	diff(t, "livenessProbe", c.LivenessProbe, pc.LivenessProbe)
	diff(t, "lifecycle", c.Lifecycle, pc.Lifecycle)
	diff(t, "resources", c.Resources, pc.Resources)
	diff(t, "volumeMounts", c.VolumeMounts, pc.VolumeMounts)
	csc := c.SecurityContext.DeepCopy()
	csc.RunAsUser = nil // the chart repeats the pod's runAsUser on the container
	diff(t, "container securityContext", csc, pc.SecurityContext)

	// Args: the plain ones less --redis URL, which the chart passes as
	// RLS_REDIS from its Secret.
	url, ok := flag(pc.Args, "--redis")
	if !ok {
		t.Fatalf("plain Deployment has no --redis")
	}
	i := slices.Index(pc.Args, "--redis")
	wantArgs := slices.Delete(slices.Clone(pc.Args), i, i+2)
	diff(t, "args", c.Args, wantArgs)
	wantRedisSecret(t, o, cc, "sluice-redis", "url", url)
	for _, e := range pc.Env {
		if ce := env(cc, e.Name); ce == nil || !equality.Semantic.DeepEqual(*ce, e) {
			t.Errorf("env %s: chart %+v, plain %+v", e.Name, ce, e)
		}
	}
}

// wantNarrower asserts that got holds every label of want, plus the release's instance label.
func wantNarrower(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s %v lacks %s=%s of the plain manifests", what, got, k, v)
		}
	}
	if got["app.kubernetes.io/instance"] != releaseName || len(got) != len(want)+1 {
		t.Errorf("%s %v: want the plain %v plus app.kubernetes.io/instance", what, got, want)
	}
}
