{{/*
What every component of the glm53 chart shares: names, labels, the image, and the security contexts of every pod.
Every helper is prefixed `glm53.`; a component's own helpers live in its folder, beside the templates that use them:
engine/ (_profile.tpl: the profile's facts; _vllm.tpl, _lmcache.tpl, _exporter.tpl: each container's command line and
probes; _containers.tpl: what the pod's containers share; _pod.tpl; _storage.tpl), router/_router.tpl and
staging/_staging.tpl. List-valued helpers print JSON (read back with `fromJsonArray`) so arguments stay typed.
*/}}

{{/* Names ---------------------------------------------------------------------------------------------------------- */}}

{{- define "glm53.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "glm53.fullname" -}}
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

{{- define "glm53.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "glm53.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "glm53.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Labels. Call with (dict "ctx" $ "component" "engine"). Selectors carry name + instance + component only. ---- */}}

{{- define "glm53.selectorLabels" -}}
app.kubernetes.io/name: {{ include "glm53.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "glm53.labels" -}}
{{ include "glm53.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: glm53
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
helm.sh/chart: {{ include "glm53.chart" .ctx }}
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Images ---------------------------------------------------------------------------------------------------------- */}}

{{- define "glm53.image" -}}
{{- if .Values.mock.enabled }}
{{- printf "%s:%s" .Values.mock.image.repository (default .Chart.AppVersion .Values.mock.image.tag) }}
{{- else if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default (include "glm53.servingImageTag" .) .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The serving image's default tag: the chart's appVersion, suffixed with a non-default vLLM generation, then a
non-default LMCache generation (what ansible/build-images.yml tags a build with VLLM_VERSION=<vllm generation> and
LMCACHE_SOURCE=<lmcache generation>). */}}
{{- define "glm53.servingImageTag" -}}
{{- .Chart.AppVersion }}{{ if include "glm53.vllmNext" . }}-vllm{{ .Values.vllm.generation }}{{ end }}
{{- if include "glm53.lmcacheNegotiates" . }}-lmcache{{ .Values.lmcache.generation }}{{ end }}
{{- end }}

{{- define "glm53.imagePullPolicy" -}}
{{- if .Values.mock.enabled }}{{ .Values.mock.image.pullPolicy }}{{ else }}{{ .Values.image.pullPolicy }}{{ end }}
{{- end }}

{{/* Security contexts of every pod the chart runs (engine, router, `helm test`) ----------------------------------- */}}

{{- define "glm53.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop:
    - ALL
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "glm53.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end }}
