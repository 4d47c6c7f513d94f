package examples

import (
	"io"
	"net"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/cmd/rls/flags"
	"github.com/sluice-rls/sluice/descriptors"
)

// apiVersions are the kinds the examples may hold, with their apiVersion.
// A new kind must be added here, so that a typo in either is caught.
var apiVersions = map[string]string{
	"ConfigMap":               "v1",
	"Namespace":               "v1",
	"Service":                 "v1",
	"Deployment":              "apps/v1",
	"PodDisruptionBudget":     "policy/v1",
	"HorizontalPodAutoscaler": "autoscaling/v2",
	"ServiceMonitor":          "monitoring.coreos.com/v1",
	"EnvoyFilter":             "networking.istio.io/v1alpha3",
	"Gateway":                 "gateway.networking.k8s.io/v1",
	"HTTPRoute":               "gateway.networking.k8s.io/v1",
}

// dnsLabel is the form of Kubernetes object names used here (RFC 1123).
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// object is the part of a Kubernetes object the tests read; Spec is decoded
// further by kind.
type object struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name      string            `yaml:"name"`
		Namespace string            `yaml:"namespace"`
		Labels    map[string]string `yaml:"labels"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec yaml.Node         `yaml:"spec"`

	file string
}

func (o *object) String() string { return o.file + ": " + o.Kind + " " + o.Metadata.Name }

// spec decodes the object's spec into out.
func (o *object) spec(t *testing.T, out any) {
	t.Helper()
	if err := o.Spec.Decode(out); err != nil {
		t.Fatalf("%s: spec: %v", o, err)
	}
}

type labelSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels"`
}

// selects reports whether s selects labels (matchLabels only), never
// selecting everything.
func (s labelSelector) selects(labels map[string]string) bool {
	if len(s.MatchLabels) == 0 {
		return false
	}
	for k, v := range s.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	return true
}

type deploymentSpec struct {
	Selector labelSelector `yaml:"selector"`
	Template struct {
		Metadata struct {
			Labels map[string]string `yaml:"labels"`
		} `yaml:"metadata"`
		Spec podSpec `yaml:"spec"`
	} `yaml:"template"`
}

type podSpec struct {
	TerminationGracePeriodSeconds *int `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               struct {
		RunAsNonRoot *bool `yaml:"runAsNonRoot"`
	} `yaml:"securityContext"`
	Containers []container `yaml:"containers"`
	Volumes    []struct {
		Name      string `yaml:"name"`
		ConfigMap *struct {
			Name string `yaml:"name"`
		} `yaml:"configMap"`
	} `yaml:"volumes"`
}

type container struct {
	Name  string   `yaml:"name"`
	Image string   `yaml:"image"`
	Args  []string `yaml:"args"`
	Ports []struct {
		Name          string `yaml:"name"`
		ContainerPort int    `yaml:"containerPort"`
	} `yaml:"ports"`
	ReadinessProbe *probe `yaml:"readinessProbe"`
	LivenessProbe  *probe `yaml:"livenessProbe"`
	Lifecycle      struct {
		PreStop *struct {
			Sleep *struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		RunAsNonRoot             *bool `yaml:"runAsNonRoot"`
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		Capabilities             struct {
			Drop []string `yaml:"drop"`
		} `yaml:"capabilities"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		SubPath   string `yaml:"subPath"`
	} `yaml:"volumeMounts"`
}

type probe struct {
	HTTPGet *struct {
		Path string `yaml:"path"`
		Port any    `yaml:"port"` // name or number
	} `yaml:"httpGet"`
}

// portNumber resolves a port given by name or number against c's ports.
func (c *container) portNumber(port any) int {
	switch p := port.(type) {
	case int:
		return p
	case string:
		for _, cp := range c.Ports {
			if cp.Name == p {
				return cp.ContainerPort
			}
		}
		if n, err := strconv.Atoi(p); err == nil {
			return n
		}
	}
	return 0
}

type servicePort struct {
	Name       string `yaml:"name"`
	Port       int    `yaml:"port"`
	TargetPort any    `yaml:"targetPort"`
}

type serviceSpec struct {
	Selector map[string]string `yaml:"selector"`
	Ports    []servicePort     `yaml:"ports"`
}

// objects reads the Kubernetes objects of the given files.
func objects(t *testing.T, files ...string) []*object {
	t.Helper()
	var out []*object
	for _, f := range files {
		for i, doc := range yamlDocs(t, f) {
			m, ok := doc.(map[string]any)
			if !ok || m["kind"] == nil {
				continue
			}
			data, err := yaml.Marshal(doc)
			if err != nil {
				t.Fatal(err)
			}
			o := &object{file: f + "#" + strconv.Itoa(i+1)}
			if err := yaml.Unmarshal(data, o); err != nil {
				t.Fatalf("%s: document %d: %v", f, i+1, err)
			}
			out = append(out, o)
		}
	}
	return out
}

// objectsByDir groups every Kubernetes object under envoy-examples/ by the
// directory of its file: the objects applied together.
func objectsByDir(t *testing.T) map[string][]*object {
	t.Helper()
	byDir := make(map[string][]*object)
	for _, f := range exampleFiles(t, ".yaml", ".yml") {
		byDir[path.Dir(f)] = append(byDir[path.Dir(f)], objects(t, f)...)
	}
	return byDir
}

// findObject returns the object of a kind and name in file.
func findObject(t *testing.T, file, kind, name string) *object {
	t.Helper()
	for _, o := range objects(t, file) {
		if o.Kind == kind && o.Metadata.Name == name {
			return o
		}
	}
	t.Fatalf("%s: no %s %s", file, kind, name)
	return nil
}

// ofKind returns the objects of one kind.
func ofKind(objs []*object, kind string) []*object {
	var out []*object
	for _, o := range objs {
		if o.Kind == kind {
			out = append(out, o)
		}
	}
	return out
}

// TestYAMLFilesParse reads every YAML file under envoy-examples/, every
// document of each, and requires each document to be something a test
// checks: a Kubernetes object, the Envoy bootstrap, a Prometheus rule file
// or its promtool tests.
func TestYAMLFilesParse(t *testing.T) {
	files := exampleFiles(t, ".yaml", ".yml")
	if len(files) == 0 {
		t.Fatal("no YAML files found")
	}
	for _, f := range files {
		for i, doc := range yamlDocs(t, f) {
			m, ok := doc.(map[string]any)
			switch {
			case !ok:
				t.Errorf("%s: document %d is a %T, not a mapping", f, i+1, doc)
			case f == "compose/envoy.yaml":
				// TestComposeEnvoy*.
			case f == "compose/compose.yaml" || strings.HasPrefix(f, "compose/grafana/"):
				// TestComposeFile here; the schema module loads them.
			case f == "compose/prometheus.yml" && m["scrape_configs"] != nil:
				// TestComposeFile.
			case m["kind"] != nil || m["apiVersion"] != nil:
				// Kubernetes: TestKubernetesObjects and those below.
			case f == "envoy.yaml":
				// TestEnvoy*.
			case m["groups"] != nil:
				// TestPrometheusRules.
			case m["rule_files"] != nil:
				// TestPrometheusRuleUnitTests.
			default:
				t.Errorf("%s: document %d is not a Kubernetes object, Envoy bootstrap or Prometheus file", f, i+1)
			}
		}
	}
}

func TestKubernetesObjects(t *testing.T) {
	byDir := objectsByDir(t)
	for _, dir := range []string{"kubernetes", "istio"} {
		if len(byDir[dir]) == 0 {
			t.Errorf("no Kubernetes objects in %s/", dir)
		}
	}
	for _, objs := range byDir {
		for _, o := range objs {
			want, known := apiVersions[o.Kind]
			switch {
			case !known:
				t.Errorf("%s: kind %q is not one the examples use (add it to apiVersions)", o, o.Kind)
			case o.APIVersion != want:
				t.Errorf("%s: apiVersion %q, want %q", o, o.APIVersion, want)
			}
			if !dnsLabel.MatchString(o.Metadata.Name) {
				t.Errorf("%s: metadata.name %q is not a DNS label", o, o.Metadata.Name)
			}
		}
	}
	for _, kind := range []string{"ConfigMap", "Service", "Deployment", "ServiceMonitor", "PodDisruptionBudget", "HorizontalPodAutoscaler"} {
		if len(ofKind(byDir["kubernetes"], kind)) == 0 {
			t.Errorf("kubernetes/ has no %s", kind)
		}
	}
}

// TestRuleConfigMaps loads the sluice rules of every ConfigMap with the
// real parser: each data key ending in .yaml or .yml is a rule file, and
// the files of one ConfigMap form one rule set.
func TestRuleConfigMaps(t *testing.T) {
	for _, objs := range objectsByDir(t) {
		for _, cm := range ofKind(objs, "ConfigMap") {
			var files []*descriptors.File
			for key, content := range cm.Data {
				if !strings.HasSuffix(key, ".yaml") && !strings.HasSuffix(key, ".yml") {
					continue
				}
				f, err := descriptors.Parse(cm.file+":"+key, []byte(content))
				if err != nil {
					t.Errorf("%s: %v", cm, err)
					continue
				}
				files = append(files, f)
			}
			if len(files) == 0 {
				t.Errorf("%s: no rule file (a data key ending in .yaml)", cm)
				continue
			}
			cfg, err := descriptors.New(files, descriptors.Options{GrayKey: "gray"})
			if err != nil {
				t.Errorf("%s: %v", cm, err)
				continue
			}
			for _, w := range cfg.Warnings() {
				t.Errorf("%s: rules load with a warning (rls validate --strict fails): %v", cm, w)
			}
			if cfg.Len() == 0 {
				t.Errorf("%s: rules load, but define no rule", cm)
			}
		}
	}
}

// TestDeployments checks each sluice Deployment: its arguments parse with
// rls serve's own flag parser, the rules come from a ConfigMap mounted as a
// directory (hot reload), the Redis URL parses, probes and ports match the
// server's defaults, the admin address stays on loopback, and the container
// is locked down.
func TestDeployments(t *testing.T) {
	found := 0
	for _, objs := range objectsByDir(t) {
		for _, d := range ofKind(objs, "Deployment") {
			found++
			checkDeployment(t, d, objs)
		}
	}
	if found == 0 {
		t.Fatal("no Deployment found")
	}
}

func checkDeployment(t *testing.T, d *object, dirObjs []*object) {
	t.Helper()
	var spec deploymentSpec
	d.spec(t, &spec)
	if !spec.Selector.selects(spec.Template.Metadata.Labels) {
		t.Errorf("%s: selector %v does not select the pod labels %v", d, spec.Selector.MatchLabels, spec.Template.Metadata.Labels)
	}
	pod := spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%s: %d containers, want the sluice container alone", d, len(pod.Containers))
	}
	c := pod.Containers[0]
	if len(c.Args) == 0 || c.Args[0] != "serve" {
		t.Fatalf("%s: args %q, want `serve` and its flags", d, c.Args)
	}
	st, err := flags.ParseServe(c.Args[1:], func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatalf("%s: rls serve %q: %v", d, c.Args[1:], err)
	}

	// Rules: a ConfigMap mounted as a directory, not through subPath, so
	// that the kubelet's symlink swap reaches the file watcher.
	if st.Config == "" {
		t.Errorf("%s: no --config: the pod would serve the embedded example rules", d)
	} else {
		checkRulesMount(t, d, &c, &pod, st.Config, dirObjs)
	}
	if st.Redis == "" {
		t.Errorf("%s: no --redis: limits would be per pod only", d)
	} else if _, err := redisbackend.ParseURL(st.Redis, st.RedisTimeout); err != nil {
		t.Errorf("%s: --redis: %v", d, err)
	}

	// Ports and probes, against the addresses the server listens on.
	grpcPort, httpPort := addrPort(t, st.GRPCAddr), addrPort(t, st.HTTPAddr)
	if got := c.portNumber("grpc"); got != grpcPort {
		t.Errorf("%s: container port grpc = %d, want %d (--grpc-addr %s)", d, got, grpcPort, st.GRPCAddr)
	}
	if got := c.portNumber("http"); got != httpPort {
		t.Errorf("%s: container port http = %d, want %d (--http-addr %s)", d, got, httpPort, st.HTTPAddr)
	}
	// The admin address (/json spends tokens) stays on the pod's loopback
	// and is not declared as a port, so no Service can expose it.
	if st.AdminAddr != "" {
		host, _, err := net.SplitHostPort(st.AdminAddr)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			t.Errorf("%s: --admin-addr %q is not a loopback address: /json would be reachable from other pods", d, st.AdminAddr)
		}
		adminPort := addrPort(t, st.AdminAddr)
		for _, p := range c.Ports {
			if p.ContainerPort == adminPort {
				t.Errorf("%s: container port %s = %d is the admin port (--admin-addr %s)", d, p.Name, adminPort, st.AdminAddr)
			}
		}
	}
	for name, p := range map[string]*probe{"readinessProbe": c.ReadinessProbe, "livenessProbe": c.LivenessProbe} {
		switch {
		case p == nil || p.HTTPGet == nil:
			t.Errorf("%s: no %s.httpGet", d, name)
		case p.HTTPGet.Path != "/healthcheck" || c.portNumber(p.HTTPGet.Port) != httpPort:
			t.Errorf("%s: %s GET %s on port %v, want /healthcheck on %d", d, name, p.HTTPGet.Path, p.HTTPGet.Port, httpPort)
		}
	}

	checkTermination(t, d, &c, &pod, st.DrainTimeout)

	for _, r := range []string{"cpu", "memory"} {
		if c.Resources.Requests[r] == "" {
			t.Errorf("%s: no resources.requests.%s", d, r)
		}
	}
	if c.Resources.Limits["memory"] == "" {
		t.Errorf("%s: no resources.limits.memory", d)
	}

	sc := c.SecurityContext
	if !isTrue(sc.RunAsNonRoot) && !isTrue(pod.SecurityContext.RunAsNonRoot) {
		t.Errorf("%s: runAsNonRoot is not set", d)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: allowPrivilegeEscalation is not false", d)
	}
	if !isTrue(sc.ReadOnlyRootFilesystem) {
		t.Errorf("%s: readOnlyRootFilesystem is not true", d)
	}
	if !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("%s: capabilities.drop %q lacks ALL", d, sc.Capabilities.Drop)
	}
}

// checkTermination checks the pod's way out: a preStop sleep keeps it
// serving while the Envoys in front drop it (DNS refresh, health checks)
// before SIGTERM starts the drain, and the grace period covers that pause
// plus --drain-timeout, so the kubelet's SIGKILL never cuts the drain short.
func checkTermination(t *testing.T, d *object, c *container, pod *podSpec, drain time.Duration) {
	t.Helper()
	pre := c.Lifecycle.PreStop
	if pre == nil || pre.Sleep == nil || pre.Sleep.Seconds < 2 || pre.Sleep.Seconds > 30 {
		t.Errorf("%s: lifecycle.preStop %+v, want sleep.seconds between 2 and 30 (serve while the Envoys drop the pod, then drain)", d, pre)
		return
	}
	pause := time.Duration(pre.Sleep.Seconds) * time.Second
	grace := 30 * time.Second // Kubernetes' default
	if pod.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	}
	if grace <= pause+drain {
		t.Errorf("%s: terminationGracePeriodSeconds %v is not longer than the preStop sleep %v plus --drain-timeout %v", d, grace, pause, drain)
	}
}

// checkRulesMount checks that dir (--config) is the mount path of a
// ConfigMap volume, without subPath, and that the ConfigMap is defined
// beside the Deployment.
func checkRulesMount(t *testing.T, d *object, c *container, pod *podSpec, dir string, dirObjs []*object) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if path.Clean(m.MountPath) != path.Clean(dir) {
			continue
		}
		if m.SubPath != "" {
			t.Errorf("%s: rules mounted with subPath %q: ConfigMap updates never reach the pod", d, m.SubPath)
		}
		for _, v := range pod.Volumes {
			if v.Name != m.Name {
				continue
			}
			if v.ConfigMap == nil {
				t.Errorf("%s: volume %s at %s is not a ConfigMap", d, v.Name, dir)
				return
			}
			for _, cm := range ofKind(dirObjs, "ConfigMap") {
				if cm.Metadata.Name == v.ConfigMap.Name && cm.Metadata.Namespace == d.Metadata.Namespace {
					return
				}
			}
			t.Errorf("%s: ConfigMap %s is not defined beside it", d, v.ConfigMap.Name)
			return
		}
		t.Errorf("%s: volume mount %s names no volume", d, m.Name)
		return
	}
	t.Errorf("%s: --config %s is not a volume mount", d, dir)
}

func isTrue(b *bool) bool { return b != nil && *b }

// addrPort returns the port of a listen address such as ":8081".
func addrPort(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("listen address %q: %v", addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("listen address %q: %v", addr, err)
	}
	return n
}

// TestKubernetesReferences checks that the objects of one directory fit
// together: Services and PodDisruptionBudgets select the Deployment's pods
// and its ports, ServiceMonitors select a Service and one of its ports, and
// autoscalers target a Deployment defined beside them.
func TestKubernetesReferences(t *testing.T) {
	for dir, objs := range objectsByDir(t) {
		deployments := ofKind(objs, "Deployment")
		pods := make(map[*object]deploymentSpec)
		for _, d := range deployments {
			var spec deploymentSpec
			d.spec(t, &spec)
			pods[d] = spec
		}
		// selectedPods returns the Deployment whose pods sel selects.
		selectedPods := func(o *object, sel labelSelector) (*object, bool) {
			for _, d := range deployments {
				if d.Metadata.Namespace == o.Metadata.Namespace && sel.selects(pods[d].Template.Metadata.Labels) {
					return d, true
				}
			}
			return nil, false
		}

		services := make(map[*object]serviceSpec)
		for _, s := range ofKind(objs, "Service") {
			var spec serviceSpec
			s.spec(t, &spec)
			services[s] = spec
			d, ok := selectedPods(s, labelSelector{MatchLabels: spec.Selector})
			if !ok {
				t.Errorf("%s: selector %v selects no Deployment's pods in %s/", s, spec.Selector, dir)
				continue
			}
			c := pods[d].Template.Spec.Containers[0]
			for _, p := range spec.Ports {
				target := p.TargetPort
				if target == nil {
					target = p.Port
				}
				if c.portNumber(target) == 0 {
					t.Errorf("%s: port %s targets %v, not a port of %s", s, p.Name, target, d)
				}
			}
		}

		for _, sm := range ofKind(objs, "ServiceMonitor") {
			var spec struct {
				Selector  labelSelector `yaml:"selector"`
				Endpoints []struct {
					Port string `yaml:"port"`
					Path string `yaml:"path"`
				} `yaml:"endpoints"`
			}
			sm.spec(t, &spec)
			var svc *object
			for s := range services {
				if s.Metadata.Namespace == sm.Metadata.Namespace && spec.Selector.selects(s.Metadata.Labels) {
					svc = s
				}
			}
			if svc == nil {
				t.Errorf("%s: selector %v selects no Service in %s/", sm, spec.Selector.MatchLabels, dir)
				continue
			}
			if len(spec.Endpoints) == 0 {
				t.Errorf("%s: no endpoints", sm)
			}
			for _, ep := range spec.Endpoints {
				if !slices.ContainsFunc(services[svc].Ports, func(p servicePort) bool { return p.Name == ep.Port }) {
					t.Errorf("%s: endpoint port %q is not a port name of %s", sm, ep.Port, svc)
				}
				if ep.Path != "/metrics" {
					t.Errorf("%s: endpoint path %q, want /metrics", sm, ep.Path)
				}
			}
		}

		for _, pdb := range ofKind(objs, "PodDisruptionBudget") {
			var spec struct {
				Selector labelSelector `yaml:"selector"`
			}
			pdb.spec(t, &spec)
			if _, ok := selectedPods(pdb, spec.Selector); !ok {
				t.Errorf("%s: selector %v selects no Deployment's pods in %s/", pdb, spec.Selector.MatchLabels, dir)
			}
		}

		for _, hpa := range ofKind(objs, "HorizontalPodAutoscaler") {
			var spec struct {
				ScaleTargetRef struct {
					APIVersion string `yaml:"apiVersion"`
					Kind       string `yaml:"kind"`
					Name       string `yaml:"name"`
				} `yaml:"scaleTargetRef"`
				MinReplicas int `yaml:"minReplicas"`
				MaxReplicas int `yaml:"maxReplicas"`
			}
			hpa.spec(t, &spec)
			ref := spec.ScaleTargetRef
			if !slices.ContainsFunc(deployments, func(d *object) bool {
				return ref.Kind == "Deployment" && ref.APIVersion == "apps/v1" && d.Metadata.Name == ref.Name && d.Metadata.Namespace == hpa.Metadata.Namespace
			}) {
				t.Errorf("%s: scaleTargetRef %+v is no Deployment in %s/", hpa, ref, dir)
			}
			// Two pods at least, so that a disruption budget of one
			// unavailable pod keeps one serving.
			if spec.MinReplicas < 2 || spec.MaxReplicas < spec.MinReplicas {
				t.Errorf("%s: replicas %d..%d, want at least 2 and max ≥ min", hpa, spec.MinReplicas, spec.MaxReplicas)
			}
		}
	}
}

// TestFallbackNodesFromReplicas: every Deployment using Redis sets the N
// its pods use before they have read the node registry (pods started
// during a Redis outage, or with a wrong secret) from its replica count:
// --fallback-nodes-initial is spec.replicas, or the maxReplicas of the
// autoscaler that owns the count, so that such pods together never admit
// more than a global limit. (Without it a pod assumes the built-in 10.)
func TestFallbackNodesFromReplicas(t *testing.T) {
	found := 0
	for dir, objs := range objectsByDir(t) {
		for _, d := range ofKind(objs, "Deployment") {
			var spec struct {
				Replicas       *int `yaml:"replicas"`
				deploymentSpec `yaml:",inline"`
			}
			d.spec(t, &spec)
			args := spec.Template.Spec.Containers[0].Args
			st, err := flags.ParseServe(args[1:], func(string) string { return "" }, io.Discard)
			if err != nil || st.Redis == "" {
				continue // TestDeployments reports it
			}
			found++
			want, from := 0, ""
			if spec.Replicas != nil {
				want, from = *spec.Replicas, "spec.replicas"
			}
			for _, hpa := range ofKind(objs, "HorizontalPodAutoscaler") {
				var hs struct {
					ScaleTargetRef struct {
						Kind string `yaml:"kind"`
						Name string `yaml:"name"`
					} `yaml:"scaleTargetRef"`
					MaxReplicas int `yaml:"maxReplicas"`
				}
				hpa.spec(t, &hs)
				if hs.ScaleTargetRef.Kind == "Deployment" && hs.ScaleTargetRef.Name == d.Metadata.Name && hpa.Metadata.Namespace == d.Metadata.Namespace {
					want, from = hs.MaxReplicas, hpa.String()+" maxReplicas"
				}
			}
			switch {
			case want == 0:
				t.Errorf("%s: no replica count in %s/ (spec.replicas or an autoscaler's maxReplicas)", d, dir)
			case st.FallbackNodesInitial != want:
				t.Errorf("%s: --fallback-nodes-initial %d, want %d (%s)", d, st.FallbackNodesInitial, want, from)
			}
		}
	}
	if found == 0 {
		t.Fatal("no Deployment with --redis found")
	}
}
