package charttest

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// valueSets are the renderings tested; each check asserts what its values
// promise, on top of checkCommon.
var valueSets = []struct {
	name  string
	vals  string
	kinds string // the objects rendered, sorted
	check func(t *testing.T, o *objects)
}{
	{
		name:  "example rules, otherwise defaults",
		vals:  "rules: {examples: true}",
		kinds: "ConfigMap/sluice-rules Deployment/sluice HorizontalPodAutoscaler/sluice PodDisruptionBudget/sluice Service/sluice ServiceAccount/sluice",
		check: func(t *testing.T, o *objects) {
			_, c := o.sluice(t)
			if env(c, "RLS_REDIS") != nil {
				t.Errorf("RLS_REDIS set by default: the chart assumes no Redis")
			}
			wantExampleRules(t, o)
			wantGoMemLimit(t, c)
			if got, _ := flag(c.Args, "--fallback-nodes-initial"); got != "12" {
				t.Errorf("--fallback-nodes-initial %q, want 12", got)
			}
			if c.ReadinessProbe.HTTPGet == nil || c.ReadinessProbe.HTTPGet.Path != "/healthcheck" || c.ReadinessProbe.HTTPGet.Port.String() != "http" {
				t.Errorf("readiness probe %+v, want GET /healthcheck on http", c.ReadinessProbe)
			}
			if _, ok := flag(c.Args, "--tls-cert"); ok {
				t.Errorf("TLS on by default")
			}
			if _, ok := flag(c.Args, "--adaptive-config"); ok {
				t.Errorf("adaptive limits on by default")
			}
			for _, name := range globalFlags {
				if _, ok := flag(c.Args, name); ok {
					t.Errorf("%s set by default: sluice's default is the chart's", name)
				}
			}
		},
	},
	{
		name:  "hpa",
		vals:  "rules: {examples: true}\nautoscaling: {enabled: true, minReplicas: 4, maxReplicas: 20, targetCPUUtilizationPercentage: 70}",
		kinds: "ConfigMap/sluice-rules Deployment/sluice HorizontalPodAutoscaler/sluice PodDisruptionBudget/sluice Service/sluice ServiceAccount/sluice",
		check: func(t *testing.T, o *objects) {
			d, c := o.sluice(t)
			h := o.HPAs[0].Spec
			if h.MaxReplicas != 20 || h.MinReplicas == nil || *h.MinReplicas != 4 ||
				h.Metrics[0].Resource.Target.AverageUtilization == nil || *h.Metrics[0].Resource.Target.AverageUtilization != 70 {
				t.Errorf("HPA spec %+v", h)
			}
			if got, _ := flag(c.Args, "--fallback-nodes-initial"); got != "20" {
				t.Errorf("--fallback-nodes-initial %q, want maxReplicas 20", got)
			}
			if d.Spec.Replicas != nil {
				t.Errorf("replicas set with HPA")
			}
		},
	},
	{
		name:  "fixed replicas",
		vals:  "rules: {examples: true}\nautoscaling: {enabled: false}\nreplicaCount: 5",
		kinds: "ConfigMap/sluice-rules Deployment/sluice PodDisruptionBudget/sluice Service/sluice ServiceAccount/sluice",
		check: func(t *testing.T, o *objects) {
			d, c := o.sluice(t)
			if d.Spec.Replicas == nil || *d.Spec.Replicas != 5 {
				t.Errorf("replicas %v, want 5", d.Spec.Replicas)
			}
			if got, _ := flag(c.Args, "--fallback-nodes-initial"); got != "5" {
				t.Errorf("--fallback-nodes-initial %q, want 5", got)
			}
		},
	},
	{
		name:  "redis from an existing secret",
		vals:  "rules: {examples: true}\nredis: {existingSecret: {name: platform-redis, key: uri}}",
		kinds: "ConfigMap/sluice-rules Deployment/sluice HorizontalPodAutoscaler/sluice PodDisruptionBudget/sluice Service/sluice ServiceAccount/sluice",
		check: func(t *testing.T, o *objects) {
			d, c := o.sluice(t)
			wantRedisSecret(t, o, c, "platform-redis", "uri", "")
			if _, ok := d.Spec.Template.Annotations["checksum/redis-url"]; ok {
				t.Errorf("checksum of a URL the chart does not know")
			}
		},
	},
	{
		name:  "redis url from values",
		vals:  "rules: {examples: true}\nredis: {url: 'rediss://sluice:s3cret@redis.example:6380/0'}",
		kinds: "ConfigMap/sluice-rules Deployment/sluice HorizontalPodAutoscaler/sluice PodDisruptionBudget/sluice Secret/sluice-redis Service/sluice ServiceAccount/sluice",
		check: func(t *testing.T, o *objects) {
			d, c := o.sluice(t)
			wantRedisSecret(t, o, c, "sluice-redis", "url", "rediss://sluice:s3cret@redis.example:6380/0")
			if d.Spec.Template.Annotations["checksum/redis-url"] == "" {
				t.Errorf("no checksum/redis-url: a new URL would not restart the pods")
			}
		},
	},
	{
		name:  "bundled redis",
		vals:  "rules: {examples: true}\nredis: {bundled: {enabled: true}}",
		kinds: "ConfigMap/sluice-rules Deployment/sluice Deployment/sluice-redis HorizontalPodAutoscaler/sluice PodDisruptionBudget/sluice Secret/sluice-redis Service/sluice Service/sluice-redis ServiceAccount/sluice",
		check: func(t *testing.T, o *objects) {
			_, c := o.sluice(t)
			wantRedisSecret(t, o, c, "sluice-redis", "url", "redis://sluice-redis:6379/0")
			var rd = o.Deployments[slices.IndexFunc(o.Deployments, func(d *appsv1.Deployment) bool { return d.Name == "sluice-redis" })]
			rs := o.service("sluice-redis")
			if !selects(t, &metav1.LabelSelector{MatchLabels: rs.Spec.Selector}, rd.Spec.Template.Labels) {
				t.Errorf("redis Service does not select the redis pod")
			}
			if len(rs.Spec.Ports) != 1 || rs.Spec.Ports[0].Port != 6379 {
				t.Errorf("redis Service ports %+v", rs.Spec.Ports)
			}
			rc := rd.Spec.Template.Spec.Containers[0]
			if !strings.HasPrefix(rc.Image, "redis:") || rc.SecurityContext == nil || !ptrIs(rc.SecurityContext.ReadOnlyRootFilesystem, true) ||
				!ptrIs(rd.Spec.Template.Spec.SecurityContext.RunAsNonRoot, true) {
				t.Errorf("redis container %+v", rc)
			}
		},
	},
	{
		name:  "tls and mtls",
		vals:  "rules: {examples: true}\ntls: {enabled: true, secretName: sluice-tls, clientCA: {enabled: true, secretName: envoy-ca, key: ca.pem, sans: [envoy.edge.svc, 'spiffe://cluster.local/ns/edge/sa/envoy']}}",
		kinds: "ConfigMap/sluice-rules Deployment/sluice HorizontalPodAutoscaler/sluice PodDisruptionBudget/sluice Service/sluice ServiceAccount/sluice",
		check: func(t *testing.T, o *objects) {
			d, c := o.sluice(t)
			if got, _ := flag(c.Args, "--tls-client-san"); got != "envoy.edge.svc,spiffe://cluster.local/ns/edge/sa/envoy" {
				t.Errorf("--tls-client-san %q, want the two names of tls.clientCA.sans", got)
			}
			for flagName, want := range map[string]string{
				"--tls-cert":      "sluice-tls/tls.crt",
				"--tls-key":       "sluice-tls/tls.key",
				"--tls-client-ca": "envoy-ca/ca.pem",
			} {
				file, ok := flag(c.Args, flagName)
				if !ok {
					t.Errorf("no %s in %v", flagName, c.Args)
					continue
				}
				if got := secretFile(d, c, file); got != want {
					t.Errorf("%s %s is Secret file %q, want %q", flagName, file, got, want)
				}
			}
		},
	},
	{
		name:  "tls without client ca",
		vals:  "rules: {examples: true}\ntls: {enabled: true, secretName: sluice-tls}",
		kinds: "ConfigMap/sluice-rules Deployment/sluice HorizontalPodAutoscaler/sluice PodDisruptionBudget/sluice Service/sluice ServiceAccount/sluice",
		check: func(t *testing.T, o *objects) {
			_, c := o.sluice(t)
			if _, ok := flag(c.Args, "--tls-cert"); !ok {
				t.Errorf("no --tls-cert")
			}
			if _, ok := flag(c.Args, "--tls-client-ca"); ok {
				t.Errorf("--tls-client-ca without clientCA.enabled")
			}
			if _, ok := flag(c.Args, "--tls-client-san"); ok {
				t.Errorf("--tls-client-san without clientCA.sans")
			}
		},
	},
	{
		name:  "grpc probes",
		vals:  "rules: {examples: true}\nprobes: {type: grpc}",
		kinds: "ConfigMap/sluice-rules Deployment/sluice HorizontalPodAutoscaler/sluice PodDisruptionBudget/sluice Service/sluice ServiceAccount/sluice",
		check: func(t *testing.T, o *objects) {
			_, c := o.sluice(t)
			for _, p := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe} {
				if p.GRPC == nil || p.GRPC.Port != 8081 || p.HTTPGet != nil {
					t.Errorf("probe %+v, want gRPC on 8081", p)
				}
			}
		},
	},
	{
		name:  "servicemonitor and prometheusrule",
		vals:  "rules: {examples: true}\nmetrics: {serviceMonitor: {enabled: true, labels: {release: kps}}, prometheusRule: {enabled: true, labels: {release: kps}}}",
		kinds: "ConfigMap/sluice-rules Deployment/sluice HorizontalPodAutoscaler/sluice PodDisruptionBudget/sluice PrometheusRule/sluice Service/sluice ServiceAccount/sluice ServiceMonitor/sluice",
		check: func(t *testing.T, o *objects) {
			sm := o.ServiceMonitors[0]
			if sm.Labels["release"] != "kps" || o.PrometheusRules[0].Labels["release"] != "kps" {
				t.Errorf("extra labels missing")
			}
			svc := o.service(releaseName)
			if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "http" || sm.Spec.Endpoints[0].Path != "/metrics" ||
				!slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == "http" && p.Port == 8080 }) {
				t.Errorf("ServiceMonitor endpoints %+v vs Service ports %+v", sm.Spec.Endpoints, svc.Spec.Ports)
			}
			want := plainRuleGroups(t)
			if got := o.PrometheusRules[0].Spec; !equality.Semantic.DeepEqual(got, want) {
				g, _ := yaml.Marshal(got)
				w, _ := yaml.Marshal(want)
				t.Errorf("PrometheusRule spec differs from envoy-examples/prometheus-rules.yaml:\n%s\nwant:\n%s", g, w)
			}
		},
	},
	{
		name:  "rules from an existing configmap",
		vals:  "rules: {existingConfigMap: platform-rules}",
		kinds: "Deployment/sluice HorizontalPodAutoscaler/sluice PodDisruptionBudget/sluice Service/sluice ServiceAccount/sluice",
		check: func(t *testing.T, o *objects) {
			if got := rulesConfigMap(t, o); got != "platform-rules" {
				t.Errorf("rules volume from ConfigMap %q, want platform-rules", got)
			}
		},
	},
	{
		name:  "rules from values",
		vals:  "rules: {files: {a.yaml: 'domain: a', b.yaml: 'domain: b'}}",
		kinds: "ConfigMap/sluice-rules Deployment/sluice HorizontalPodAutoscaler/sluice PodDisruptionBudget/sluice Service/sluice ServiceAccount/sluice",
		check: func(t *testing.T, o *objects) {
			cm := o.ConfigMaps[0]
			if rulesConfigMap(t, o) != cm.Name || len(cm.Data) != 2 || cm.Data["a.yaml"] != "domain: a" || cm.Data["b.yaml"] != "domain: b" {
				t.Errorf("ConfigMap %s data %v", cm.Name, cm.Data)
			}
		},
	},
	{
		name: "networkpolicy",
		vals: `rules: {examples: true}
networkPolicy:
  enabled: true
  grpcFrom:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: istio-system}}
      podSelector: {matchLabels: {app: istio-ingressgateway}}
  httpFrom:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}
    - ipBlock: {cidr: 10.0.0.0/16}`,
		kinds: "ConfigMap/sluice-rules Deployment/sluice HorizontalPodAutoscaler/sluice NetworkPolicy/sluice PodDisruptionBudget/sluice Service/sluice ServiceAccount/sluice",
		check: func(t *testing.T, o *objects) {
			np := o.NetworkPolicies[0].Spec
			if !slices.Equal(np.PolicyTypes, []networkingv1.PolicyType{"Ingress"}) || len(np.Ingress) != 2 {
				t.Fatalf("NetworkPolicy %+v", np)
			}
			grpc, http := np.Ingress[0], np.Ingress[1]
			if len(grpc.Ports) != 1 || grpc.Ports[0].Port.IntValue() != 8081 || len(grpc.From) != 1 ||
				grpc.From[0].PodSelector.MatchLabels["app"] != "istio-ingressgateway" || grpc.From[0].NamespaceSelector == nil {
				t.Errorf("gRPC rule %+v", grpc)
			}
			if len(http.Ports) != 1 || http.Ports[0].Port.IntValue() != 8080 || len(http.From) != 2 ||
				http.From[1].IPBlock == nil || http.From[1].IPBlock.CIDR != "10.0.0.0/16" {
				t.Errorf("HTTP rule %+v", http)
			}
		},
	},
	{
		name:  "spread and pdb off",
		vals:  "rules: {examples: true}\ntopologySpread: {zone: {enabled: false}, host: {whenUnsatisfiable: DoNotSchedule}}\npodDisruptionBudget: {enabled: false}",
		kinds: "ConfigMap/sluice-rules Deployment/sluice HorizontalPodAutoscaler/sluice Service/sluice ServiceAccount/sluice",
		check: func(t *testing.T, o *objects) {
			d, _ := o.sluice(t)
			tsc := d.Spec.Template.Spec.TopologySpreadConstraints
			if len(tsc) != 1 || tsc[0].TopologyKey != "kubernetes.io/hostname" || tsc[0].WhenUnsatisfiable != "DoNotSchedule" {
				t.Errorf("topology spread %+v", tsc)
			}
		},
	},
	{
		name:  "release name without the chart name",
		vals:  "rules: {examples: true}\nfullnameOverride: rl",
		kinds: "ConfigMap/rl-rules Deployment/rl HorizontalPodAutoscaler/rl PodDisruptionBudget/rl Service/rl ServiceAccount/rl",
	},
	{
		name:  "rules from xds",
		vals:  "xds: {server: 'envoy-gateway.envoy-gateway-system.svc:18001', nodeID: envoy-ratelimit}",
		kinds: "Deployment/sluice HorizontalPodAutoscaler/sluice PodDisruptionBudget/sluice Service/sluice ServiceAccount/sluice",
		check: func(t *testing.T, o *objects) {
			d, c := o.sluice(t)
			if got, _ := flag(c.Args, "--xds-server"); got != "envoy-gateway.envoy-gateway-system.svc:18001" {
				t.Errorf("--xds-server %q in %v", got, c.Args)
			}
			if got, _ := flag(c.Args, "--xds-node-id"); got != "envoy-ratelimit" {
				t.Errorf("--xds-node-id %q in %v", got, c.Args)
			}
			if _, ok := flag(c.Args, "--config"); ok || len(d.Spec.Template.Spec.Volumes) != 0 || len(c.VolumeMounts) != 0 {
				t.Errorf("rule files beside xDS: args %v, volumes %v", c.Args, d.Spec.Template.Spec.Volumes)
			}
		},
	},
	{
		name: "extra volumes, env and envFrom",
		vals: `rules: {examples: true}
extraArgs: [--emergency-key, x-emergency, --emergency-secret-file, /etc/sluice/emergency/digests]
extraEnv: [{name: RLS_LOG_LEVEL, value: debug}]
envFrom: [{secretRef: {name: sluice-env}}]
extraVolumes: [{name: emergency, secret: {secretName: sluice-emergency}}]
extraVolumeMounts: [{name: emergency, mountPath: /etc/sluice/emergency, readOnly: true}]`,
		kinds: "ConfigMap/sluice-rules Deployment/sluice HorizontalPodAutoscaler/sluice PodDisruptionBudget/sluice Service/sluice ServiceAccount/sluice",
		check: func(t *testing.T, o *objects) {
			d, c := o.sluice(t)
			if e := env(c, "RLS_LOG_LEVEL"); e == nil || e.Value != "debug" {
				t.Errorf("extraEnv RLS_LOG_LEVEL: %+v", e)
			}
			if len(c.EnvFrom) != 1 || c.EnvFrom[0].SecretRef == nil || c.EnvFrom[0].SecretRef.Name != "sluice-env" {
				t.Errorf("envFrom %+v", c.EnvFrom)
			}
			file, _ := flag(c.Args, "--emergency-secret-file")
			mounted := false
			for _, m := range c.VolumeMounts {
				if m.Name == "emergency" && strings.HasPrefix(file, m.MountPath+"/") {
					mounted = true
				}
			}
			vol := slices.IndexFunc(d.Spec.Template.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "emergency" })
			if !mounted || vol < 0 || d.Spec.Template.Spec.Volumes[vol].Secret.SecretName != "sluice-emergency" {
				t.Errorf("--emergency-secret-file %s is not in the Secret sluice-emergency: mounts %+v", file, c.VolumeMounts)
			}
			if rulesConfigMap(t, o) != "sluice-rules" {
				t.Errorf("extra volumes replaced the rules volume")
			}
			wantGoMemLimit(t, c)
		},
	},
	{
		name:  "goMemLimit from extraEnv, or none without a memory limit",
		vals:  "rules: {examples: true}\nextraEnv: [{name: GOMEMLIMIT, value: 400MiB}]",
		kinds: "ConfigMap/sluice-rules Deployment/sluice HorizontalPodAutoscaler/sluice PodDisruptionBudget/sluice Service/sluice ServiceAccount/sluice",
		check: func(t *testing.T, o *objects) {
			_, c := o.sluice(t)
			if n := countEnv(c, "GOMEMLIMIT"); n != 1 || env(c, "GOMEMLIMIT").Value != "400MiB" {
				t.Errorf("GOMEMLIMIT %d times, %+v; want only extraEnv's 400MiB", n, env(c, "GOMEMLIMIT"))
			}
			_, c = decodeAll(t, mustRender(t, "rules: {examples: true}\nresources: {limits: {memory: null}}")).sluice(t)
			if env(c, "GOMEMLIMIT") != nil {
				t.Errorf("GOMEMLIMIT without a memory limit: %+v", env(c, "GOMEMLIMIT"))
			}
		},
	},
	{
		name:  "openshift: no fixed user",
		vals:  "rules: {examples: true}\npodSecurityContext: {runAsUser: null, runAsGroup: null}\nsecurityContext: {runAsUser: null}",
		kinds: "ConfigMap/sluice-rules Deployment/sluice HorizontalPodAutoscaler/sluice PodDisruptionBudget/sluice Service/sluice ServiceAccount/sluice",
		check: func(t *testing.T, o *objects) {
			d, c := o.sluice(t)
			psc, csc := d.Spec.Template.Spec.SecurityContext, c.SecurityContext
			if psc.RunAsUser != nil || psc.RunAsGroup != nil || csc.RunAsUser != nil {
				t.Errorf("fixed IDs left: pod %+v, container %+v", psc, csc)
			}
		},
	},
	{
		name:  "podmonitor and dashboard",
		vals:  "rules: {examples: true}\nmetrics: {podMonitor: {enabled: true, labels: {release: kps}}, dashboard: {enabled: true, annotations: {grafana_folder: sluice}}}",
		kinds: "ConfigMap/sluice-dashboard ConfigMap/sluice-rules Deployment/sluice HorizontalPodAutoscaler/sluice PodDisruptionBudget/sluice PodMonitor/sluice Service/sluice ServiceAccount/sluice",
		check: func(t *testing.T, o *objects) {
			d, c := o.sluice(t)
			pm := o.PodMonitors[0]
			if pm.Labels["release"] != "kps" || !selects(t, &pm.Spec.Selector, d.Spec.Template.Labels) {
				t.Errorf("PodMonitor labels %v selector %v", pm.Labels, pm.Spec.Selector)
			}
			if len(pm.Spec.PodMetricsEndpoints) != 1 || pm.Spec.PodMetricsEndpoints[0].Port == nil || *pm.Spec.PodMetricsEndpoints[0].Port != "http" ||
				pm.Spec.PodMetricsEndpoints[0].Path != "/metrics" ||
				!slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "http" && p.ContainerPort == 8080 }) {
				t.Errorf("PodMetricsEndpoints %+v vs container ports %+v", pm.Spec.PodMetricsEndpoints, c.Ports)
			}
			i := slices.IndexFunc(o.ConfigMaps, func(cm *corev1.ConfigMap) bool { return cm.Name == "sluice-dashboard" })
			cm := o.ConfigMaps[i]
			want, err := os.ReadFile("../../../envoy-examples/grafana-dashboard.json")
			if err != nil {
				t.Fatal(err)
			}
			if cm.Labels["grafana_dashboard"] != "1" || cm.Annotations["grafana_folder"] != "sluice" || cm.Data["sluice.json"] != string(want) {
				t.Errorf("dashboard ConfigMap labels %v annotations %v, data equal to envoy-examples/grafana-dashboard.json: %v",
					cm.Labels, cm.Annotations, cm.Data["sluice.json"] == string(want))
			}
		},
	},
	{
		name: "adaptive limits from values, with redis",
		vals: `rules: {examples: true}
redis: {existingSecret: {name: platform-redis}}
adaptive:
  config:
    prometheus: http://prometheus.monitoring:9090
    policies:
      - name: api-latency
        domain: edge
        min_scale: 0.3
        interval: 15s
        signals: [{name: p99, query: 'histogram_quantile(0.99, x)', lower_above: 1, raise_below: 0.2}]`,
		kinds: "ConfigMap/sluice-adaptive ConfigMap/sluice-rules Deployment/sluice HorizontalPodAutoscaler/sluice PodDisruptionBudget/sluice Service/sluice ServiceAccount/sluice",
		check: func(t *testing.T, o *objects) {
			d, _ := o.sluice(t)
			cm, key := adaptiveFile(t, o)
			if cm != "sluice-adaptive" || key != "adaptive.yaml" {
				t.Fatalf("--adaptive-config is ConfigMap %q key %q, want sluice-adaptive adaptive.yaml", cm, key)
			}
			i := slices.IndexFunc(o.ConfigMaps, func(c *corev1.ConfigMap) bool { return c.Name == cm })
			var got map[string]any
			if err := yaml.Unmarshal([]byte(o.ConfigMaps[i].Data[key]), &got); err != nil {
				t.Fatal(err)
			}
			want := map[string]any{
				"prometheus": "http://prometheus.monitoring:9090",
				"policies": []any{map[string]any{
					"name": "api-latency", "domain": "edge", "min_scale": 0.3, "interval": "15s",
					"signals": []any{map[string]any{"name": "p99", "query": "histogram_quantile(0.99, x)", "lower_above": float64(1), "raise_below": 0.2}},
				}},
			}
			if !equality.Semantic.DeepEqual(got, want) {
				t.Errorf("adaptive file %v, want adaptive.config %v", got, want)
			}
			sum := d.Spec.Template.Annotations["checksum/adaptive-config"]
			if sum == "" {
				t.Errorf("no checksum/adaptive-config: a new file would not restart the pods, and sluice reads it at start")
			}
			changed := decodeAll(t, mustRender(t, "rules: {examples: true}\nadaptive: {config: {prometheus: 'http://p:9090', dry_run: true}}"))
			if d2, _ := changed.sluice(t); d2.Spec.Template.Annotations["checksum/adaptive-config"] == sum {
				t.Errorf("checksum/adaptive-config unchanged by another file")
			}
		},
	},
	{
		name:  "adaptive limits from an existing configmap",
		vals:  "rules: {examples: true}\nadaptive: {existingConfigMap: {name: platform-adaptive, key: policies.yaml}}",
		kinds: "ConfigMap/sluice-rules Deployment/sluice HorizontalPodAutoscaler/sluice PodDisruptionBudget/sluice Service/sluice ServiceAccount/sluice",
		check: func(t *testing.T, o *objects) {
			d, _ := o.sluice(t)
			if cm, key := adaptiveFile(t, o); cm != "platform-adaptive" || key != "policies.yaml" {
				t.Errorf("--adaptive-config is ConfigMap %q key %q, want platform-adaptive policies.yaml", cm, key)
			}
			if _, ok := d.Spec.Template.Annotations["checksum/adaptive-config"]; ok {
				t.Errorf("checksum of a file the chart does not know")
			}
			if rulesConfigMap(t, o) != "sluice-rules" {
				t.Errorf("the adaptive volume replaced the rules volume")
			}
		},
	},
}

func TestValueSets(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(vs.name, func(t *testing.T) {
			o := decodeAll(t, mustRender(t, vs.vals))
			if got := names(o); got != vs.kinds {
				t.Errorf("rendered\n  %s\nwant\n  %s", got, vs.kinds)
			}
			if strings.Contains(vs.vals, "fullnameOverride") {
				return // checkCommon looks for objects named after the release
			}
			checkCommon(t, o)
			if vs.check != nil {
				vs.check(t, o)
			}
		})
	}
}

// wantExampleRules asserts that the rules ConfigMap holds the chart's example rules, files/rules/.
func wantExampleRules(t *testing.T, o *objects) {
	t.Helper()
	files, err := filepath.Glob("../files/rules/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no example rules in files/rules: %v", err)
	}
	want := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		want[filepath.Base(f)] = string(b)
	}
	i := slices.IndexFunc(o.ConfigMaps, func(cm *corev1.ConfigMap) bool { return cm.Name == rulesConfigMap(t, o) })
	if i < 0 || !equality.Semantic.DeepEqual(o.ConfigMaps[i].Data, want) {
		t.Errorf("rules ConfigMap is not files/rules/")
	}
}

// wantGoMemLimit asserts that GOMEMLIMIT is the sluice container's memory limit, through the downward API.
func wantGoMemLimit(t *testing.T, c *corev1.Container) {
	t.Helper()
	e := env(c, "GOMEMLIMIT")
	if e == nil || e.ValueFrom == nil || e.ValueFrom.ResourceFieldRef == nil ||
		e.ValueFrom.ResourceFieldRef.Resource != "limits.memory" || e.ValueFrom.ResourceFieldRef.ContainerName != c.Name {
		t.Errorf("GOMEMLIMIT %+v, want the resourceFieldRef limits.memory of container %s", e, c.Name)
	}
	if c.Resources.Limits.Memory().IsZero() {
		t.Errorf("GOMEMLIMIT from a memory limit that is not set")
	}
}

// wantRedisSecret asserts that RLS_REDIS comes from Secret name, key, and,
// when url is set, that the chart rendered that Secret with that URL.
func wantRedisSecret(t *testing.T, o *objects, c *corev1.Container, name, key, url string) {
	t.Helper()
	e := env(c, "RLS_REDIS")
	if e == nil || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
		t.Fatalf("RLS_REDIS not from a Secret: %+v", e)
	}
	if ref := e.ValueFrom.SecretKeyRef; ref.Name != name || ref.Key != key {
		t.Errorf("RLS_REDIS from %s/%s, want %s/%s", ref.Name, ref.Key, name, key)
	}
	s := o.secret(name)
	if url == "" {
		if s != nil {
			t.Errorf("the chart rendered Secret %s, which the user owns", name)
		}
		return
	}
	if s == nil || string(s.Data[key]) != url {
		t.Errorf("Secret %s: %v, want %s=%s", name, s, key, url)
	}
}

// adaptiveFile returns the ConfigMap and key of the file --adaptive-config
// names, through the sluice container's read-only directory mounts (no
// subPath); "", "" without the flag, failing when the file is no such key.
func adaptiveFile(t *testing.T, o *objects) (configMap, key string) {
	t.Helper()
	d, c := o.sluice(t)
	path, ok := flag(c.Args, "--adaptive-config")
	if !ok {
		return "", ""
	}
	for _, m := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(path, m.MountPath+"/")
		if !ok {
			continue
		}
		if m.SubPath != "" || !m.ReadOnly || strings.Contains(rel, "/") {
			t.Errorf("adaptive mount %+v for %s: want a read-only directory, no subPath", m, path)
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil {
				return v.ConfigMap.Name, rel
			}
		}
	}
	t.Fatalf("--adaptive-config %s is in no mounted ConfigMap", path)
	return "", ""
}

// secretFile returns "secret/key" for the file at path in container c of d,
// following its volume mounts and secret volume items; "" when it is none.
func secretFile(d *appsv1.Deployment, c *corev1.Container, path string) string {
	for _, m := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(path, m.MountPath+"/")
		if !ok {
			continue
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name != m.Name || v.Secret == nil {
				continue
			}
			for _, it := range v.Secret.Items {
				if it.Path == rel {
					return v.Secret.SecretName + "/" + it.Key
				}
			}
		}
	}
	return ""
}

func rulesConfigMap(t *testing.T, o *objects) string {
	d, _ := o.sluice(t)
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == "rules" && v.ConfigMap != nil {
			return v.ConfigMap.Name
		}
	}
	return ""
}

// plainRuleGroups decodes envoy-examples/prometheus-rules.yaml strictly as
// a PrometheusRule spec.
func plainRuleGroups(t *testing.T) monitoringv1.PrometheusRuleSpec {
	t.Helper()
	b, err := os.ReadFile("../../../envoy-examples/prometheus-rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var spec monitoringv1.PrometheusRuleSpec
	if err := yaml.UnmarshalStrict(b, &spec); err != nil {
		t.Fatalf("envoy-examples/prometheus-rules.yaml: %v", err)
	}
	if len(spec.Groups) == 0 {
		t.Fatal("envoy-examples/prometheus-rules.yaml: no groups")
	}
	return spec
}

// TestFileCopies keeps the chart's copies of the alerts (promtool tests the
// original) and of the dashboard equal to those of envoy-examples/.
func TestFileCopies(t *testing.T) {
	for _, name := range []string{"prometheus-rules.yaml", "grafana-dashboard.json"} {
		want, err := os.ReadFile("../../../envoy-examples/" + name)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile("../files/" + name)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("charts/sluice/files/%s differs from envoy-examples/%s: cp envoy-examples/%s charts/sluice/files/", name, name, name)
		}
	}
}
