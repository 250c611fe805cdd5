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

{{/* Version of the preload library: the image tag (default: appVersion), a directory name under <state>/lib. */}}
{{- define "tessera.preloadVersion" -}}
{{- $v := .Values.image.tag | default .Chart.AppVersion | toString -}}
{{- if not (regexMatch "^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$" $v) -}}
{{- fail (printf "image.tag %q is not a usable version directory name; accepted: an image tag ([A-Za-z0-9_][A-Za-z0-9_.-]*)" $v) -}}
{{- end -}}
{{- $v -}}
{{- end -}}

{{/* Where the preload library appears inside pod containers: the device plugin mounts <state>/lib/<version> at /usr/local/lib/tessera (CONTAINER_LIBRARY_DIR in agent/src/kubelet/allocate.rs). */}}
{{- define "tessera.preloadContainerPath" -}}
/usr/local/lib/tessera/libtessera.so
{{- end -}}

{{/* The agent's config file (agent/src/config.rs; unknown keys are refused). */}}
{{- define "tessera.agentConfig" -}}
{{- $a := .Values.agent -}}
{{- $paths := $a.hostPaths -}}
# tessera-agent run --config /etc/tessera/agent.toml (agent/src/config.rs).
root = {{ printf "%s/containers" ($paths.state | trimSuffix "/") | quote }}
period_ms = {{ int $a.periodMs }}
listen = {{ printf "0.0.0.0:%d" (int $a.metricsPort) | quote }}
log = {{ $a.logLevel | quote }}
policy = "/etc/tessera/policy.yaml"

[watchdog]
ebpf = {{ $a.watchdog.ebpf | toString | quote }}
ebpf_object = "/usr/lib/tessera/tessera.bpf.o"
guard_object = "/usr/lib/tessera/tessera-guard.bpf.o"
context_allowance_mib = {{ int $a.watchdog.contextAllowanceMiB }}
{{- with $a.watchdog.devices }}
devices = [{{ range $i, $d := . }}{{ if $i }}, {{ end }}{{ toString $d | quote }}{{ end }}]
{{- end }}

[kubelet]
enabled = {{ or (not .Values.dra.enabled) .Values.dra.devicePlugin }}
plugin_dir = {{ $paths.devicePlugins | trimSuffix "/" | quote }}
pod_resources_socket = {{ printf "%s/kubelet.sock" ($paths.podResources | trimSuffix "/") | quote }}
resource_name = {{ $a.kubelet.resourceName | quote }}
split = {{ int $a.kubelet.split }}
placement = {{ $a.kubelet.placement | quote }}
preload_dir = {{ printf "%s/lib" ($paths.state | trimSuffix "/") | quote }}
{{- if .Values.dra.enabled }}

[dra]
enabled = true
registry_dir = {{ $paths.pluginsRegistry | trimSuffix "/" | quote }}
plugins_dir = {{ $paths.kubeletPlugins | trimSuffix "/" | quote }}
cdi_dir = {{ $paths.cdi | trimSuffix "/" | quote }}
{{- end }}
{{- end -}}

{{/* The DRA driver's name (tessera_api::dra::DRIVER). */}}
{{- define "tessera.draDriver" -}}
gpu.tessera.dev
{{- end -}}
