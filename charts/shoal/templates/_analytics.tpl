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
{{- if eq .Values.analytics.runner "sparkOperator" }}
{{- /* Spark >= 4.2 would have the submitter (the Spark operator, whose RBAC lacks it) create a
NetworkPolicy; the chart's own NetworkPolicy covers driver<->executor traffic instead. */}}
{{- $_ := set $conf "spark.kubernetes.driver.pod.excludedFeatureSteps" "org.apache.spark.deploy.k8s.features.NetworkPolicyFeatureStep" }}
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
