{{/* Shared parts of the two analytics runners (analytics-cronjob.yaml, analytics-sparkapplication.yaml). */}}

{{/* The environment analytics-job.py reads (docker/analytics-job.py). */}}
{{- define "shoal.analytics.env" -}}
- name: SHOAL_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "shoal.redis.secretName" . }}
      key: {{ include "shoal.redis.secretKey" . }}
- name: SHOAL_ANALYTICS_LAKE
  value: {{ .Values.analytics.lake.mountPath | quote }}
- name: SHOAL_ANALYTICS_MAX_RECORDS_PER_BATCH
  value: {{ .Values.analytics.maxRecordsPerBatch | quote }}
- name: SHOAL_ANALYTICS_CAPACITY_PER_REPLICA
  value: {{ .Values.analytics.capacityPerReplica | quote }}
{{- end }}

{{/* Spark settings for small data (spark.md §8), then the user's analytics.sparkConf over them. */}}
{{- define "shoal.analytics.sparkConf" -}}
{{- $conf := dict "spark.sql.shuffle.partitions" "8" "spark.sql.session.timeZone" "UTC" "spark.sql.files.maxPartitionBytes" "8m" }}
{{- if ne .Values.analytics.runner "cronJob" }}
{{- /* Spark >= 4.2 would have the submitter (spark-submit, or the Spark operator, whose RBAC lacks
it) create a NetworkPolicy; the chart's own NetworkPolicy covers driver<->executor traffic instead.
The lake is an existing claim, so the driver neither owns nor reuses on-demand PVCs: with these
two off it makes no PVC request at all, and its Role grants none (docs/analytics.md#spark-on-kubernetes). */}}
{{- $_ := set $conf "spark.kubernetes.driver.pod.excludedFeatureSteps" "org.apache.spark.deploy.k8s.features.NetworkPolicyFeatureStep" }}
{{- $_ := set $conf "spark.kubernetes.driver.ownPersistentVolumeClaim" "false" }}
{{- $_ := set $conf "spark.kubernetes.driver.reusePersistentVolumeClaim" "false" }}
{{- end }}
{{- toYaml (merge (deepCopy .Values.analytics.sparkConf) $conf) }}
{{- end }}

{{- define "shoal.analytics.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 185
runAsGroup: 185
fsGroup: 185
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* The pod template of the sparkSubmit runner's driver ("driver") or executors ("executor"):
what spark-submit and the driver do not set themselves, above all the security context that
PodSecurity "restricted" asks for, and the lake. Spark merges its own settings into it. */}}
{{- define "shoal.analytics.podTemplate" -}}
{{- $ctx := .ctx }}
apiVersion: v1
kind: Pod
metadata:
  labels:
    {{- include "shoal.componentLabels" (dict "ctx" $ctx "component" "analytics") | nindent 4 }}
spec:
  securityContext:
    {{- include "shoal.analytics.podSecurityContext" $ctx | nindent 4 }}
  {{- if $ctx.Values.imagePullSecrets }}
  {{- include "shoal.imagePullSecrets" $ctx | nindent 2 }}
  {{- end }}
  containers:
    - name: {{ .role }}
      {{- if eq .role "driver" }}
      env:
        {{- include "shoal.analytics.env" $ctx | nindent 8 }}
      {{- end }}
      securityContext:
        {{- include "shoal.containerSecurityContext" $ctx | nindent 8 }}
      volumeMounts:
        - name: lake
          mountPath: {{ $ctx.Values.analytics.lake.mountPath }}
        - name: tmp
          mountPath: /tmp
  volumes:
    - name: lake
      persistentVolumeClaim:
        claimName: {{ include "shoal.analytics.lakeClaimName" $ctx }}
    - name: tmp
      emptyDir: {}
{{- end }}
