{{/*
Template guards: refuse a configuration that cannot serve correctly, with one sentence naming what to change.
values.schema.json catches wrong types and unknown keys; these checks need the profile's facts. Included once, from the
Deployment, so every render (install, template, lint) runs them.
*/}}

{{/* True ("true") when an EnvVar list sets NAME to a value other than "" / "0" / "false". Call with (dict "env" LIST "name" NAME). */}}
{{- define "glm53.envEnabled" -}}
{{- range .env }}{{ if and (eq (toString .name) $.name) (not (has (lower (toString .value)) (list "" "0" "false"))) }}true{{ end }}{{ end }}
{{- end }}

{{- define "glm53.guards" -}}
{{- $p := include "glm53.profile" . | fromJson }}
{{- $v := .Values.vllm }}
{{- $l := .Values.lmcache }}
{{- $tp := include "glm53.tensorParallelSize" . | int }}
{{- $gpus := include "glm53.gpus" . | int }}

{{- if ne $gpus $tp }}
{{- fail (printf "vllm.gpus=%d does not match the tensor-parallel size %d: one pod runs the whole TP group on exactly TP GPUs; unset vllm.gpus or set vllm.gpus and vllm.tensorParallelSize to the same number" $gpus $tp) }}
{{- end }}

{{- if and (hasPrefix "fp8" $v.kvCacheDtype) (not $p.fp8KvCacheHopperOk) }}
{{- fail (printf "vllm.kvCacheDtype=%s is not supported for %s on Hopper (H200): its FP8 KV cache is Blackwell-only and not validated with LMCache; set vllm.kvCacheDtype=auto (BF16)" $v.kvCacheDtype $p.displayName) }}
{{- end }}

{{- if and $l.enabled (not $v.enablePrefixCaching) }}
{{- fail "vllm.enablePrefixCaching=false while lmcache.enabled=true: LMCache stores and reuses only prefix-cached blocks (and a KDA hybrid keeps its state only in the align mode prefix caching selects); set vllm.enablePrefixCaching=true, or lmcache.enabled=false for a run without LMCache" }}
{{- end }}

{{- if and (not $p.batchInvariantOk) (or $v.batchInvariant (include "glm53.envEnabled" (dict "env" $v.extraEnv "name" "VLLM_BATCH_INVARIANT"))) }}
{{- fail (printf "batch-invariant mode (VLLM_BATCH_INVARIANT=1) does not start %s on vLLM 0.33: no sparse-MLA backend supports batch invariance; set vllm.batchInvariant=false, remove VLLM_BATCH_INVARIANT from vllm.extraEnv, and compare runs at the log-prob level (glm53 validate)" $p.displayName) }}
{{- end }}

{{- if and (or $v.devMode (include "glm53.envEnabled" (dict "env" $v.extraEnv "name" "VLLM_SERVER_DEV_MODE"))) (not .Values.validation.enabled) }}
{{- fail "vLLM dev mode (vllm.devMode or VLLM_SERVER_DEV_MODE in vllm.extraEnv) without validation.enabled=true: it exposes unauthenticated admin endpoints and is only for the validation run; set validation.enabled=true on a test cluster (it turns dev mode on by itself), or turn dev mode off" }}
{{- end }}

{{- if and .Values.mock.enabled (not $l.enabled) }}
{{- fail "mock.enabled=true with lmcache.enabled=false: the mock emulates the pod with its LMCache sidecar only; set lmcache.enabled=true, or mock.enabled=false" }}
{{- end }}

{{- if $l.enabled }}
{{- if and $p.separateObjectGroupsRequired (not $l.separateObjectGroups) }}
{{- fail (printf "lmcache.separateObjectGroups=false, but %s is a hybrid whose state groups need their own cache objects; set lmcache.separateObjectGroups=true" $p.displayName) }}
{{- end }}
{{- if or (has "--run-script-api-enabled" $l.extraArgs) (include "glm53.envEnabled" (dict "env" $l.extraEnv "name" "LMCACHE_RUN_SCRIPT_API_ENABLED")) }}
{{- fail "lmcache.extraArgs/extraEnv enable /run_script, which executes arbitrary Python sent to the unauthenticated admin API; remove --run-script-api-enabled and LMCACHE_RUN_SCRIPT_API_ENABLED" }}
{{- end }}
{{- if not $l.negotiate }}
{{- $align := include "glm53.alignment" . }}
{{- if not $align }}
{{- if kindIs "invalid" $l.chunkSize }}
{{- fail (printf "%s's unified block size N was measured at TP %d only, not at TP %d, so the chunk size is unknown; set lmcache.chunkSize to the N vLLM logs at TP %d (\"Setting attention block size to N tokens\"), or set lmcache.negotiate=true with a negotiating LMCache build" $p.displayName (int $p.tensorParallelSize) $tp $tp) }}
{{- end }}
{{- else if ne 0 (mod (include "glm53.chunkSize" . | int) ($align | int)) }}
{{- fail (printf "lmcache.chunkSize=%s is not a multiple of %s's block of %s tokens at TP %d (the released LMCache 0.5.6 refuses it when the engine connects); set lmcache.chunkSize to a multiple of %s (recommended %d), or unset it to use the profile's" (include "glm53.chunkSize" .) $p.displayName $align $tp $align (int $p.recommendedChunkSize)) }}
{{- end }}
{{- end }}
{{- end }}

{{- if and (eq .Values.weights.source "existingPvc") (not .Values.weights.existingClaim) }}
{{- fail "weights.source=existingPvc needs weights.existingClaim: set it to the name of the PVC holding the weights" }}
{{- end }}
{{- if and (eq .Values.weights.source "hostPath") (not .Values.weights.hostPath) }}
{{- fail "weights.source=hostPath needs weights.hostPath: set it to the node directory holding the weights" }}
{{- end }}
{{- end }}
