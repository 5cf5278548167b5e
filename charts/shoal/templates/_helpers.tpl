{{/* Names, labels and the few values every template derives the same way. */}}

{{- define "shoal.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The prefix of every resource name: the release name, unless it already contains the chart name. */}}
{{- define "shoal.fullname" -}}
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

{{- define "shoal.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "shoal.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: shoal
{{- end }}

{{/* Selector labels of one component: call with (dict "ctx" $ "component" "operator"). */}}
{{- define "shoal.selectorLabels" -}}
app.kubernetes.io/name: {{ include "shoal.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "shoal.componentLabels" -}}
{{ include "shoal.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* An image reference; the tag defaults to the chart's appVersion (call with dict "ctx" $ "image" .Values.x.image). */}}
{{- define "shoal.image" -}}
{{- printf "%s:%s" .image.repository (.image.tag | default .ctx.Chart.AppVersion) }}
{{- end }}

{{- define "shoal.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (printf "%s-operator" (include "shoal.fullname" .)) .Values.operator.serviceAccount.name }}
{{- else }}
{{- required "operator.serviceAccount.name is required when operator.serviceAccount.create is false" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "shoal.analytics.serviceAccountName" -}}
{{- if .Values.analytics.serviceAccount.create }}
{{- default (printf "%s-analytics" (include "shoal.fullname" .)) .Values.analytics.serviceAccount.name }}
{{- else }}
{{- required "analytics.serviceAccount.name is required when analytics.serviceAccount.create is false" .Values.analytics.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Namespaces the operator watches in namespaced RBAC mode: the listed ones, else the release's. */}}
{{- define "shoal.watchNamespaces" -}}
{{- if .Values.rbac.watchNamespaces }}
{{- join "," .Values.rbac.watchNamespaces }}
{{- else }}
{{- .Release.Namespace }}
{{- end }}
{{- end }}

{{- define "shoal.redis.fullname" -}}
{{- printf "%s-redis" (include "shoal.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The Secret (and key) holding the Redis URL every Shoal component uses. */}}
{{- define "shoal.redis.secretName" -}}
{{- if .Values.redis.enabled }}
{{- include "shoal.redis.fullname" . }}
{{- else }}
{{- required "redis.existingSecret.name is required when redis.enabled is false" .Values.redis.existingSecret.name }}
{{- end }}
{{- end }}

{{- define "shoal.redis.secretKey" -}}
{{- if .Values.redis.enabled }}url{{ else }}{{ .Values.redis.existingSecret.key }}{{ end }}
{{- end }}

{{- define "shoal.analytics.lakeClaimName" -}}
{{- default (printf "%s-analytics-lake" (include "shoal.fullname" .)) .Values.analytics.lake.existingClaim }}
{{- end }}

{{/* The security context of every Shoal container: no privilege escalation or capabilities, read-only root. */}}
{{- define "shoal.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "shoal.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets -}}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Whether the PrometheusRule is rendered: prometheusRule.enabled, or with null the ServiceMonitors' setting. */}}
{{- define "shoal.prometheusRuleEnabled" -}}
{{- ternary .Values.serviceMonitor.enabled .Values.prometheusRule.enabled (kindIs "invalid" .Values.prometheusRule.enabled) -}}
{{- end }}

{{/* Whether the chart runs Redis with replicas and Sentinel ("true" or ""). */}}
{{- define "shoal.redis.sentinelMode" -}}
{{- if and .Values.redis.enabled (eq .Values.redis.mode "sentinel") }}true{{ end }}
{{- end }}

{{- define "shoal.redis.replicaName" -}}
{{- printf "%s-redis-replica" (include "shoal.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "shoal.redis.sentinelName" -}}
{{- printf "%s-redis-sentinel" (include "shoal.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The first Redis node (the primary of a group no sentinel knows yet): host:port. */}}
{{- define "shoal.redis.firstNode" -}}
{{- printf "%s.%s.svc:6379" (include "shoal.redis.fullname" .) .Release.Namespace }}
{{- end }}

{{/* The sentinels, host:port each (a list, for the BrokerCluster and the URL). */}}
{{- define "shoal.redis.sentinelHosts" -}}
{{- $name := include "shoal.redis.sentinelName" . }}
{{- range $i := until (int .Values.redis.sentinel.replicas) }}
- {{ printf "%s-%d.%s.%s.svc:26379" $name $i $name $.Release.Namespace }}
{{- end }}
{{- end }}

{{/* Selector of every Redis data node (the first node and its replicas), for the PDB and anti-affinity. */}}
{{- define "shoal.redis.nodeSelector" -}}
matchLabels:
  app.kubernetes.io/name: {{ include "shoal.name" . }}
  app.kubernetes.io/instance: {{ .Release.Name }}
  shoal.dev/redis-role: node
{{- end }}

{{/* Pod anti-affinity across nodes for pods matching a selector (dict "ctx" $ "selector" (yaml)). */}}
{{- define "shoal.redis.antiAffinity" -}}
podAntiAffinity:
  {{- if eq .ctx.Values.redis.podAntiAffinity "hard" }}
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        {{- .selector | nindent 8 }}
  {{- else }}
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          {{- .selector | nindent 10 }}
  {{- end }}
{{- end }}

{{/* The digest of the Redis start scripts: a change rolls the Redis and sentinel pods. */}}
{{- define "shoal.redis.scriptsChecksum" -}}
{{- .Files.Get "files/redis/redis-start.sh" | cat (.Files.Get "files/redis/sentinel-start.sh") (.Files.Get "files/redis/find-primary.sh") | sha256sum | trunc 16 }}
{{- end }}
