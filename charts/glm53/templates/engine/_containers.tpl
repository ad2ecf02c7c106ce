{{/*
What the engine pod's containers share: the log volume and secret mounts, the loopback address and the ports no other
container may take, the supervisor every server runs under, the loopback HTTP check the probes use, and the base
environment. The stage container (staging/_staging.tpl) and the `helm test` pod use some of them too.
*/}}

{{/* Pod-local wiring (`glm53 pod` moves these ports on loopback, glm53.loopback) -------------------------------------- */}}

{{- define "glm53.logDir" -}}/var/log/glm53{{- end }}
{{- define "glm53.probeStateDir" -}}{{ include "glm53.logDir" . }}/.probe{{- end }}
{{- define "glm53.hfTokenDir" -}}/var/run/secrets/huggingface{{- end }}
{{- define "glm53.loopback" -}}127.0.0.1{{- end }}
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

{{/* PID 1 of the engine and sidecar containers: Debian's tini (both images install it) in front of `glm53 supervise`.
A pod's `command` replaces the image's ENTRYPOINT, so the chart names tini itself: it reaps orphans and forwards
signals even if the supervisor were to miss one. */}}
{{- define "glm53.supervisorCommand" -}}
["/usr/bin/tini", "--", "glm53", "supervise"]
{{- end }}

{{/* `glm53 supervise` arguments for one server. Call with (dict "log" PATH "program" LIST "args" LIST), and
"hold" SECONDS for a server held back on a restart in the same pod, "l2" (dict "dir" DIR "maxBytes" N) for the one
whose supervisor keeps the fs L2 tier under its bound, "tier" HOST:PORT for one that starts only once the shared
tier's Redis answers (glm53.l2gate). */}}
{{- define "glm53.superviseArgs" -}}
{{- $args := list "--log" .log }}
{{- with .hold }}{{ $args = concat $args (list "--hold-after-restart" (toString .)) }}{{ end }}
{{- with .l2 }}{{ $args = concat $args (list "--l2-dir" .dir "--l2-max-bytes" .maxBytes) }}{{ end }}
{{- with .tier }}{{ $args = concat $args (list "--wait-for-resp" .) }}{{ end }}
{{- concat $args (list "--") .program .args | toJson }}
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

{{- define "glm53.volumeMounts.runtime" -}}
- name: tmp
  mountPath: /tmp
- name: shm
  mountPath: /dev/shm
{{- end }}
