{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name; just the release name when it contains the chart name. */}}
{{- define "sluice.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "sluice.redisName" -}}
{{- printf "%s-redis" (include "sluice.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sluice.labels" -}}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/component: ratelimit
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sluice.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* N for --fallback-nodes-initial: the most pods that can run. */}}
{{- define "sluice.maxPods" -}}
{{- if .Values.autoscaling.enabled }}
{{- int .Values.autoscaling.maxReplicas }}
{{- else }}
{{- int .Values.replicaCount }}
{{- end }}
{{- end }}

{{/* The Secret and key RLS_REDIS comes from; empty name: no Redis. */}}
{{- define "sluice.redisSecretName" -}}
{{- if .Values.redis.existingSecret.name }}
{{- .Values.redis.existingSecret.name }}
{{- else if or .Values.redis.bundled.enabled .Values.redis.url }}
{{- include "sluice.redisName" . }}
{{- end }}
{{- end }}

{{- define "sluice.redisSecretKey" -}}
{{- if .Values.redis.existingSecret.name }}
{{- required "redis.existingSecret.key is required" .Values.redis.existingSecret.key }}
{{- else }}
{{- "url" }}
{{- end }}
{{- end }}

{{/* The chart creates the Redis Secret (from redis.url, or the bundled Redis' URL). */}}
{{- define "sluice.createRedisSecret" -}}
{{- if and (not .Values.redis.existingSecret.name) (or .Values.redis.bundled.enabled .Values.redis.url) }}true{{ end }}
{{- end }}

{{- define "sluice.redisURL" -}}
{{- if .Values.redis.bundled.enabled }}
{{- printf "redis://%s:6379/0" (include "sluice.redisName" .) }}
{{- else }}
{{- .Values.redis.url }}
{{- end }}
{{- end }}

{{/* The chart creates the rules ConfigMap (from rules.files or the example rules). */}}
{{- define "sluice.createRulesConfigMap" -}}
{{- if or .Values.rules.files .Values.rules.examples }}true{{ end }}
{{- end }}

{{/* GOMEMLIMIT from the memory limit: on, a limit set, and not in extraEnv. */}}
{{- define "sluice.goMemLimit" -}}
{{- if and .Values.goMemLimit (dig "limits" "memory" "" (.Values.resources | default dict)) }}
{{- $own := false }}
{{- range .Values.extraEnv }}{{ if eq .name "GOMEMLIMIT" }}{{ $own = true }}{{ end }}{{ end }}
{{- if not $own }}true{{ end }}
{{- end }}
{{- end }}

{{- define "sluice.rulesConfigMap" -}}
{{- if .Values.rules.existingConfigMap }}
{{- .Values.rules.existingConfigMap }}
{{- else }}
{{- printf "%s-rules" (include "sluice.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}
{{- end }}

{{/* The ConfigMap of the adaptive-limits file: yours, or the chart's from adaptive.config; empty: off. */}}
{{- define "sluice.adaptiveConfigMap" -}}
{{- if .Values.adaptive.existingConfigMap.name }}
{{- .Values.adaptive.existingConfigMap.name }}
{{- else if .Values.adaptive.config }}
{{- printf "%s-adaptive" (include "sluice.fullname" . | trunc 54 | trimSuffix "-") }}
{{- end }}
{{- end }}

{{/* The key of the adaptive-limits file in its ConfigMap. */}}
{{- define "sluice.adaptiveKey" -}}
{{- if .Values.adaptive.existingConfigMap.name }}
{{- .Values.adaptive.existingConfigMap.key }}
{{- else }}
{{- "adaptive.yaml" }}
{{- end }}
{{- end }}

{{/* Checks of value combinations that would render a broken release. */}}
{{- define "sluice.validate" -}}
{{- if and .Values.autoscaling.enabled (lt (int .Values.autoscaling.maxReplicas) (int .Values.autoscaling.minReplicas)) }}
{{- fail "autoscaling.maxReplicas must be at least autoscaling.minReplicas" }}
{{- end }}
{{- if lt (int (include "sluice.maxPods" .)) 1 }}
{{- fail "replicaCount (or autoscaling.maxReplicas) must be at least 1" }}
{{- end }}
{{- if and .Values.tls.enabled (not .Values.tls.secretName) }}
{{- fail "tls.enabled needs tls.secretName (a kubernetes.io/tls Secret)" }}
{{- end }}
{{- if and .Values.tls.clientCA.enabled (not .Values.tls.enabled) }}
{{- fail "tls.clientCA.enabled (mTLS) needs tls.enabled" }}
{{- end }}
{{- if and .Values.tls.clientCA.enabled (not .Values.tls.clientCA.secretName) }}
{{- fail "tls.clientCA.enabled needs tls.clientCA.secretName" }}
{{- end }}
{{- if not (has .Values.probes.type (list "http" "grpc")) }}
{{- fail "probes.type must be http or grpc" }}
{{- end }}
{{- if and (eq .Values.probes.type "grpc") .Values.tls.enabled }}
{{- fail "probes.type grpc cannot be used with tls.enabled (the kubelet's gRPC probe has no TLS); use http" }}
{{- end }}
{{- if and .Values.networkPolicy.enabled (or (empty .Values.networkPolicy.grpcFrom) (empty .Values.networkPolicy.httpFrom)) }}
{{- fail "networkPolicy.grpcFrom and networkPolicy.httpFrom must not be empty (an empty from admits every pod)" }}
{{- end }}
{{- $sources := list }}
{{- if .Values.rules.existingConfigMap }}{{ $sources = append $sources "rules.existingConfigMap" }}{{ end }}
{{- if .Values.rules.files }}{{ $sources = append $sources "rules.files" }}{{ end }}
{{- if .Values.rules.examples }}{{ $sources = append $sources "rules.examples" }}{{ end }}
{{- if .Values.xds.server }}{{ $sources = append $sources "xds.server" }}{{ end }}
{{- if not $sources }}
{{- fail "sluice needs rules: set rules.files, rules.existingConfigMap or xds.server (rules.examples=true serves the example rules, for trials only: they block 50.0.0.5 and limit every address to 100/s)" }}
{{- end }}
{{- if gt (len $sources) 1 }}
{{- fail (printf "give one source of rules, not %s" (join " and " $sources)) }}
{{- end }}
{{- if and .Values.adaptive.config .Values.adaptive.existingConfigMap.name }}
{{- fail "give one source of adaptive limits, not adaptive.config and adaptive.existingConfigMap.name" }}
{{- end }}
{{- if and .Values.xds.nodeID (not .Values.xds.server) }}
{{- fail "xds.nodeID needs xds.server" }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled .Values.metrics.podMonitor.enabled }}
{{- fail "metrics.serviceMonitor.enabled and metrics.podMonitor.enabled: choose one (both would scrape every pod twice)" }}
{{- end }}
{{- if not (include "sluice.redisSecretName" .) }}
{{- range $key, $flag := dict "consistency" "consistency" "share" "share" "leasePeriod" "lease-period" }}
{{- if ne (toString (index $.Values.globalLayer $key)) "" }}
{{- fail (printf "globalLayer.%s needs Redis: set redis.url, redis.existingSecret.name or redis.bundled.enabled (without Redis each pod limits alone and sluice ignores --%s)" $key $flag) }}
{{- end }}
{{- end }}
{{- end }}
{{- if .Values.rules.files }}
{{- range $name, $_ := .Values.rules.files }}
{{- if not (hasSuffix ".yaml" $name) }}
{{- fail (printf "rules.files key %q must end in .yaml (sluice reads *.yaml only)" $name) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* The bundled Redis' labels: not sluice's, so that no sluice selector (Service, ServiceMonitor, PDB) picks it. */}}
{{- define "sluice.redisSelectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}-redis
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sluice.redisLabels" -}}
{{ include "sluice.redisSelectorLabels" . }}
app.kubernetes.io/component: redis
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}
