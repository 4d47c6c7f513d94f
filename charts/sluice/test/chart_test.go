package charttest

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// sluice returns the sluice Deployment (not the bundled Redis) and its container.
func (o *objects) sluice(t *testing.T) (*appsv1.Deployment, *corev1.Container) {
	t.Helper()
	for _, d := range o.Deployments {
		if d.Name == releaseName {
			for i := range d.Spec.Template.Spec.Containers {
				if c := &d.Spec.Template.Spec.Containers[i]; c.Name == "sluice" {
					return d, c
				}
			}
			t.Fatalf("Deployment %s has no container sluice", d.Name)
		}
	}
	t.Fatalf("no Deployment %s among %v", releaseName, o.names)
	return nil, nil
}

func (o *objects) secret(name string) *corev1.Secret {
	for _, s := range o.Secrets {
		if s.Name == name {
			return s
		}
	}
	return nil
}

func (o *objects) service(name string) *corev1.Service {
	for _, s := range o.Services {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// flag returns the value after name in args, and whether name is there.
func flag(args []string, name string) (string, bool) {
	i := slices.Index(args, name)
	if i < 0 || i+1 >= len(args) {
		return "", i >= 0
	}
	return args[i+1], true
}

// countEnv returns how often c sets the variable name.
func countEnv(c *corev1.Container, name string) int {
	n := 0
	for _, e := range c.Env {
		if e.Name == name {
			n++
		}
	}
	return n
}

func env(c *corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

// selects reports whether sel selects set, never selecting everything.
func selects(t *testing.T, sel *metav1.LabelSelector, set map[string]string) bool {
	t.Helper()
	if sel == nil || (len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0) {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatalf("selector %v: %v", sel, err)
	}
	return s.Matches(labels.Set(set))
}

// checkCommon asserts what every rendering must hold.
func checkCommon(t *testing.T, o *objects) {
	t.Helper()
	d, c := o.sluice(t)
	pod := d.Spec.Template
	podLabels := pod.Labels

	// Selectors: Deployment, Service, PDB, NetworkPolicy and ServiceMonitor all
	// find the sluice pods; the Service is the one the ServiceMonitor finds.
	if !selects(t, d.Spec.Selector, podLabels) {
		t.Errorf("Deployment selector %v does not select its pods %v", d.Spec.Selector, podLabels)
	}
	svc := o.service(releaseName)
	if svc == nil {
		t.Fatalf("no Service %s", releaseName)
	}
	if !selects(t, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, podLabels) {
		t.Errorf("Service selector %v does not select the pods %v", svc.Spec.Selector, podLabels)
	}
	for _, s := range o.Services {
		if s.Name != releaseName && selects(t, &metav1.LabelSelector{MatchLabels: s.Spec.Selector}, podLabels) {
			t.Errorf("Service %s also selects the sluice pods", s.Name)
		}
	}
	for _, p := range o.PDBs {
		if !selects(t, p.Spec.Selector, podLabels) {
			t.Errorf("PDB selector %v does not select the pods", p.Spec.Selector)
		}
	}
	for _, np := range o.NetworkPolicies {
		if !selects(t, &np.Spec.PodSelector, podLabels) {
			t.Errorf("NetworkPolicy podSelector %v does not select the pods", np.Spec.PodSelector)
		}
	}
	for _, sm := range o.ServiceMonitors {
		var found []string
		for _, s := range o.Services {
			if selects(t, &sm.Spec.Selector, s.Labels) {
				found = append(found, s.Name)
			}
		}
		if !slices.Equal(found, []string{releaseName}) {
			t.Errorf("ServiceMonitor selects Services %v, want [%s]", found, releaseName)
		}
	}
	for _, pm := range o.PodMonitors {
		if !selects(t, &pm.Spec.Selector, podLabels) {
			t.Errorf("PodMonitor selector %v does not select the pods", pm.Spec.Selector)
		}
	}
	for _, other := range o.Deployments {
		if other != d && selects(t, d.Spec.Selector, other.Spec.Template.Labels) {
			t.Errorf("sluice's selector also selects the pods of Deployment %s", other.Name)
		}
	}
	for _, tsc := range pod.Spec.TopologySpreadConstraints {
		if !selects(t, tsc.LabelSelector, podLabels) {
			t.Errorf("topology spread on %s does not select the pods", tsc.TopologyKey)
		}
	}

	// The admin address stays on loopback: not overridden, no port for it.
	for _, a := range c.Args {
		if strings.Contains(a, "admin") || strings.Contains(a, "8082") {
			t.Errorf("argument %q touches the admin address", a)
		}
	}
	for _, e := range c.Env {
		if e.Name == "RLS_ADMIN_ADDR" {
			t.Errorf("env sets RLS_ADMIN_ADDR")
		}
	}
	var ports []int32
	for _, p := range c.Ports {
		ports = append(ports, p.ContainerPort)
	}
	if !slices.Equal(ports, []int32{8081, 8080}) {
		t.Errorf("containerPorts %v, want [8081 8080] (never the admin port 8082)", ports)
	}
	for _, s := range o.Services {
		for _, p := range s.Spec.Ports {
			if p.Port == 8082 || p.TargetPort == intstr.FromInt32(8082) {
				t.Errorf("Service %s exposes 8082", s.Name)
			}
		}
	}
	for _, np := range o.NetworkPolicies {
		for _, r := range np.Spec.Ingress {
			for _, p := range r.Ports {
				if p.Port != nil && p.Port.IntValue() == 8082 {
					t.Errorf("NetworkPolicy admits 8082")
				}
			}
		}
	}

	// --fallback-nodes-initial is the most pods that can run.
	var maxPods int32
	switch {
	case len(o.HPAs) == 1:
		if d.Spec.Replicas != nil {
			t.Errorf("HPA on, but the Deployment sets replicas %d", *d.Spec.Replicas)
		}
		h := o.HPAs[0]
		if h.Spec.ScaleTargetRef.Kind != "Deployment" || h.Spec.ScaleTargetRef.Name != d.Name {
			t.Errorf("HPA targets %v, want Deployment %s", h.Spec.ScaleTargetRef, d.Name)
		}
		maxPods = h.Spec.MaxReplicas
	case len(o.HPAs) == 0 && d.Spec.Replicas != nil:
		maxPods = *d.Spec.Replicas
	default:
		t.Fatalf("%d HPAs, replicas %v", len(o.HPAs), d.Spec.Replicas)
	}
	if got, _ := flag(c.Args, "--fallback-nodes-initial"); got != strconv.Itoa(int(maxPods)) {
		t.Errorf("--fallback-nodes-initial %q, want %d (the most pods)", got, maxPods)
	}

	// Redis only as RLS_REDIS from a Secret, never as an argument or literal.
	if _, ok := flag(c.Args, "--redis"); ok {
		t.Errorf("--redis in args %v", c.Args)
	}
	if e := env(c, "RLS_REDIS"); e != nil {
		if e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
			t.Errorf("RLS_REDIS is not from a Secret: %+v", e)
		} else if ref := e.ValueFrom.SecretKeyRef; o.secret(ref.Name) != nil {
			if _, ok := o.secret(ref.Name).Data[ref.Key]; !ok {
				t.Errorf("RLS_REDIS from Secret %s key %s, which it lacks", ref.Name, ref.Key)
			}
		}
	}

	// Rules: --xds-server, or --config, the mount of a ConfigMap volume, a
	// directory (no subPath); never both.
	cfg, hasConfig := flag(c.Args, "--config")
	if _, xds := flag(c.Args, "--xds-server"); xds == hasConfig {
		t.Errorf("args %v: want one of --config and --xds-server", c.Args)
	}
	var rulesVol string
	for _, m := range c.VolumeMounts {
		if m.MountPath == cfg {
			rulesVol = m.Name
			if m.SubPath != "" || !m.ReadOnly {
				t.Errorf("rules mount %+v: want read-only, no subPath", m)
			}
		}
	}
	var rulesCM string
	for _, v := range pod.Spec.Volumes {
		if v.Name == rulesVol && v.ConfigMap != nil {
			rulesCM = v.ConfigMap.Name
		}
	}
	if hasConfig && rulesCM == "" {
		t.Errorf("--config %q is not a mounted ConfigMap", cfg)
	}

	// Locked-down pod security.
	psc, csc := pod.Spec.SecurityContext, c.SecurityContext
	if psc == nil || csc == nil {
		t.Fatalf("missing securityContext")
	}
	// runAsUser: 65532 (the image's), or none (OpenShift picks one); never root.
	image := func(uid *int64) bool { return uid == nil || *uid == 65532 }
	if !ptrIs(psc.RunAsNonRoot, true) || !image(psc.RunAsUser) || !image(csc.RunAsUser) ||
		psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v", psc)
	}
	if !ptrIs(csc.RunAsNonRoot, true) || !ptrIs(csc.ReadOnlyRootFilesystem, true) ||
		!ptrIs(csc.AllowPrivilegeEscalation, false) || csc.Capabilities == nil ||
		!slices.Equal(csc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(csc.Capabilities.Add) != 0 {
		t.Errorf("container securityContext %+v", csc)
	}
	if n := countEnv(c, "GOMEMLIMIT"); n > 1 {
		t.Errorf("GOMEMLIMIT set %d times", n)
	}
	if !ptrIs(pod.Spec.AutomountServiceAccountToken, false) {
		t.Errorf("service account token mounted")
	}

	// Probes, preStop, resources.
	if c.ReadinessProbe == nil || c.LivenessProbe == nil {
		t.Errorf("probes missing")
	}
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds <= 0 {
		t.Errorf("no preStop sleep: %+v", c.Lifecycle)
	} else if g := pod.Spec.TerminationGracePeriodSeconds; g == nil || *g <= c.Lifecycle.PreStop.Sleep.Seconds+10 {
		t.Errorf("terminationGracePeriodSeconds %v not above preStop + drain-timeout (10s)", g)
	}
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v", c.Resources)
	}
}

func ptrIs[T comparable](p *T, v T) bool { return p != nil && *p == v }

func names(o *objects) string { return strings.Join(o.names, " ") }
