{{/*
The profile's facts (files/profiles.json, generated from the glm53 toolkit): the model, its tensor-parallel size and GPU
count, and the cache geometry the engine, the sidecar, the router, the probes and the guards are built from.
*/}}

{{- define "glm53.profiles" -}}
{{- .Files.Get "files/profiles.json" }}
{{- end }}

{{/* The selected profile as JSON; unknown names fail with the list of known ones. */}}
{{- define "glm53.profile" -}}
{{- $profiles := include "glm53.profiles" . | fromJson }}
{{- if not (hasKey $profiles (toString .Values.profile)) }}
{{- fail (printf "profile %q is unknown; set profile to one of: %s" (toString .Values.profile) (keys $profiles | sortAlpha | join ", ")) }}
{{- end }}
{{- get $profiles .Values.profile | toJson }}
{{- end }}

{{- define "glm53.tensorParallelSize" -}}
{{- $p := include "glm53.profile" . | fromJson }}
{{- if kindIs "invalid" .Values.vllm.tensorParallelSize }}{{ int $p.tensorParallelSize }}{{ else }}{{ int .Values.vllm.tensorParallelSize }}{{ end }}
{{- end }}

{{- define "glm53.gpus" -}}
{{- if kindIs "invalid" .Values.vllm.gpus }}{{ include "glm53.tensorParallelSize" . }}{{ else }}{{ int .Values.vllm.gpus }}{{ end }}
{{- end }}

{{- define "glm53.model" -}}
{{- $p := include "glm53.profile" . | fromJson }}
{{- default $p.modelId .Values.vllm.model }}
{{- end }}

{{/* The model id the API lists in /v1/models. */}}
{{- define "glm53.servedModel" -}}
{{- default (include "glm53.model" .) .Values.vllm.servedModelName }}
{{- end }}

{{/*
Block alignment every chunk must be a multiple of at the configured TP size; empty when unknown. It is the profile's
`requiredAlignment` when the groups have fixed block sizes or the TP size is the profile's; for hybrids (groups that follow
vLLM's unified block size N) at another TP size it is N where N was measured there, else unknown.
*/}}
{{- define "glm53.alignment" -}}
{{- $p := include "glm53.profile" . | fromJson }}
{{- $tp := include "glm53.tensorParallelSize" . | int }}
{{- $fixed := false }}
{{- range $p.groups }}{{- if and (not (kindIs "invalid" .tokensPerBlock)) (gt (int .tokensPerBlock) 0) }}{{ $fixed = true }}{{ end }}{{- end }}
{{- if or (not (include "glm53.followsUnifiedBlock" .)) (eq $tp (int $p.tensorParallelSize)) }}
{{- with $p.requiredAlignment }}{{ int . }}{{ end }}
{{- else if and (hasKey $p.unifiedBlockSizeByTp (toString $tp)) (not $fixed) }}
{{- get $p.unifiedBlockSizeByTp (toString $tp) | int }}
{{- end }}
{{- end }}

{{/* Non-empty when some of the profile's groups take vLLM's unified block size N (which depends on the TP size). */}}
{{- define "glm53.followsUnifiedBlock" -}}
{{- range (include "glm53.profile" . | fromJson).groups }}{{ if kindIs "invalid" .tokensPerBlock }}true{{ end }}{{ end }}
{{- end }}
