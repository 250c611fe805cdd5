{{/* Base name of every object: the release name, plus "-tessera" unless it already says tessera. */}}
{{- define "tessera.fullname" -}}
{{- if contains "tessera" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-tessera" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "tessera.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: tessera
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component; call with (dict "root" $ "component" "agent"). */}}
{{- define "tessera.selectorLabels" -}}
app.kubernetes.io/name: tessera
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* A tessera image; call with (dict "root" $ "name" "tessera-agent"). */}}
{{- define "tessera.image" -}}
{{- $tag := .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- printf "%s/%s:%s" (.root.Values.image.registry | trimSuffix "/") .name $tag -}}
{{- end -}}

{{/* Name of the scheduler's Service, which also serves the webhook. */}}
{{- define "tessera.schedulerService" -}}
{{- printf "%s-scheduler" (include "tessera.fullname" .) -}}
{{- end -}}
