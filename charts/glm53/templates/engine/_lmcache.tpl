{{/*
The engine pod's LMCache sidecars (`lmcache server`, one per entry of glm53.lmcacheServers; the container itself is
glm53.engine.lmcacheSidecar in _pod.tpl): the generation's features, the servers' ports, logs and API key, the chunk
size, and each server's arguments and health probe.
*/}}

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
{{- define "glm53.lmcacheApiKeyDir" -}}/var/run/secrets/lmcache-api-key{{- end }}
{{- define "glm53.lmcacheApiKeyFile" -}}{{ include "glm53.lmcacheApiKeyDir" . }}/{{ .Values.lmcache.apiKey.secretKey }}{{- end }}
{{- define "glm53.lmcachePort" -}}5555{{- end }}
{{- define "glm53.lmcacheHttpPort" -}}8080{{- end }}
{{- define "glm53.lmcacheLog" -}}{{ include "glm53.logDir" . }}/lmcache.log{{- end }}
{{- define "glm53.lmcacheL2Dir" -}}/var/cache/glm53/lmcache-l2{{- end }}

{{/* The server's `--l2-adapter` JSON for lmcache.l2 (lmcache 0.5.6: fs_l2_adapter.py:204-225 and
resp_l2_adapter.py:68-98 parse these keys); "" when the tier is off. The resp password is not here: it reaches the
server from the Secret as LMCACHE_RESP_PASSWORD (glm53.lmcacheL2Env). */}}
{{- define "glm53.lmcacheL2Adapter" -}}
{{- $l2 := .Values.lmcache.l2 }}
{{- if eq $l2.type "fs" }}
{{- dict "type" "fs" "base_path" (include "glm53.lmcacheL2Dir" .) | toJson }}
{{- else if eq $l2.type "resp" }}
{{- dict "type" "resp" "host" $l2.resp.host "port" (int $l2.resp.port) "num_workers" (int $l2.resp.numWorkers) | toJson }}
{{- end }}
{{- end }}

{{/* The bytes the fs tier's janitor keeps it under: 85 % of its sizeLimit (lmcache.l2.fs.sizeGi), so a second of
writes between two passes stays below the limit past which the kubelet evicts the pod. */}}
{{- define "glm53.lmcacheL2MaxBytes" -}}
{{- printf "%.0f" (mulf .Values.lmcache.l2.fs.sizeGi 0.85 1073741824.0) }}
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

{{/* Seconds a restarted sidecar holds before its server starts: resilience.restartHoldSeconds, else two heartbeat
intervals (the ping period plus its timeout) and 5 s, so the engine's ping has failed when the new server listens. */}}
{{- define "glm53.restartHoldSeconds" -}}
{{- $r := .Values.lmcache.resilience }}
{{- if kindIs "invalid" $r.restartHoldSeconds }}{{ add (mul 2 $r.heartbeatIntervalSeconds) 5 }}{{ else }}{{ $r.restartHoldSeconds }}{{ end }}
{{- end }}

{{/*
`lmcache server` arguments after the program, in every mode (the mock image runs the real server too): the user's
extraArgs first, then the chart's flags, so the parser's last-occurrence-wins rule keeps loopback binds and /run_script
off. The CPU runners run these as rendered (glm53.pod.plan, glm53.pod.loopback); benchmarks/gpu_proof spells them for a
GPU host without Helm, and tests/benchmarks/test_gpu_proof_dryrun.py holds it to this helper.
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
{{- with include "glm53.lmcacheL2Adapter" $ctx }}{{ $args = concat $args (list "--l2-adapter" . "--l2-prefetch-policy" $l.l2.prefetchPolicy) }}{{ end }}
{{- append $args "--no-run-script-api-enabled" | toJson }}
{{- end }}

{{/* One server's sidecar arguments. Call with (dict "ctx" $ "server" SERVER), SERVER from glm53.lmcacheServers. */}}
{{- define "glm53.lmcacheContainerArgs" -}}
{{- $hold := include "glm53.restartHoldSeconds" .ctx }}
{{- $janitor := dict }}
{{- if and (eq .ctx.Values.lmcache.l2.type "fs") (eq (int .server.index) 0) }}
{{- /* One janitor per pod: the first server's supervisor bounds the directory every server of the pod writes. */}}
{{- $janitor = dict "dir" (include "glm53.lmcacheL2Dir" .ctx) "maxBytes" (include "glm53.lmcacheL2MaxBytes" .ctx) }}
{{- end }}
{{- $r := .ctx.Values.lmcache.l2.resp }}
{{- $tier := ternary (printf "%s:%d" $r.host (int $r.port)) "" (eq .ctx.Values.lmcache.l2.type "resp") }}
{{- include "glm53.superviseArgs" (dict "log" .server.log "hold" (ternary "" $hold (eq $hold "0")) "l2" $janitor "tier" $tier "program" (list "lmcache" "server") "args" (include "glm53.lmcacheServerArgs" . | fromJsonArray)) }}
{{- end }}

{{/* One server's /healthcheck. Call with (dict "ctx" $ "server" SERVER). */}}
{{- define "glm53.lmcacheHealthCommand" -}}
{{- $url := printf "http://%s:%d/healthcheck" (include "glm53.loopback" .ctx) (int .server.httpPort) }}
{{- include "glm53.httpCheckCommand" (dict "urls" (list $url) "model" "") }}
{{- end }}

{{/* The LMCache API key, read-only, for the containers that serve or scrape the server's HTTP API. */}}
{{- define "glm53.volumeMounts.lmcacheApiKey" -}}
{{- if include "glm53.lmcacheApiKey" . }}
- name: lmcache-api-key
  mountPath: {{ include "glm53.lmcacheApiKeyDir" . }}
  readOnly: true
{{- end }}
{{- end }}

{{/* The L2 tier's directory (lmcache.l2.type=fs), for every LMCache sidecar of the pod. */}}
{{- define "glm53.volumeMounts.lmcacheL2" -}}
{{- if eq .Values.lmcache.l2.type "fs" }}
- name: lmcache-l2
  mountPath: {{ include "glm53.lmcacheL2Dir" . }}
{{- end }}
{{- end }}

{{/* The shared tier's credentials from the Secret (lmcache.l2.type=resp with auth): environment LMCache's resp adapter
reads when its JSON carries none (lmcache 0.5.6 resp_l2_adapter.py:151-154), so no password is on a command line. */}}
{{- define "glm53.lmcacheL2Env" -}}
{{- $r := .Values.lmcache.l2.resp }}
{{- if and (eq .Values.lmcache.l2.type "resp") $r.auth.enabled }}
- name: LMCACHE_RESP_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $r.auth.secretName }}
      key: {{ $r.auth.passwordKey }}
{{- with $r.auth.username }}
- name: LMCACHE_RESP_USERNAME
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}
