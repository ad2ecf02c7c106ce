{{/*
Helpers of the router component (`router.enabled`): the vLLM project's router (vllm-router 0.1.17) in front of the
engine pods. Its command line is built here once, as a JSON list, so the Deployment renders it and the chart tests
parse it with the router's own parser (`vllm_router.launch_router.parse_router_args`).
*/}}

{{- define "glm53.router.fullname" -}}
{{- printf "%s-router" (include "glm53.fullname" . | trunc 56 | trimSuffix "-") }}
{{- end }}

{{/* The engine pods' selector as the router's `--selector key=value ...` items: exactly the engine Service's selector. */}}
{{- define "glm53.router.engineSelector" -}}
{{- $items := list }}
{{- range $k, $v := include "glm53.selectorLabels" (dict "ctx" . "component" "engine") | fromYaml }}
{{- $items = append $items (printf "%s=%s" $k $v) }}
{{- end }}
{{- toJson $items }}
{{- end }}

{{/* The KV-event block size: the engine's scheduler block size, which the profile fixes (1152 for GLM-5.3-Flash at TP 4). */}}
{{- define "glm53.router.kvEventBlockSize" -}}
{{- include "glm53.alignment" . }}
{{- end }}

{{- define "glm53.router.kvAware" -}}
{{- if and .Values.router.enabled (eq .Values.router.policy "kv_aware") }}true{{ end }}
{{- end }}

{{/*
`vllm serve` arguments the engines get for the router (JSON list, empty without the router):
- `--enable-scale-out`: vLLM 0.33 serves /v1/completions/render and /v1/chat/completions/render, through which
  vllm-router tokenizes prompts for cache_aware and kv_aware, only with it; without it they answer 403
  (vllm/entrypoints/scale_out/factories.py:94-129) and the router routes on load alone. It also opens vLLM's
  token-in/token-out and derender routes on the API port, which the NetworkPolicy admits as it admits /v1.
- kv_aware only: vLLM 0.33's KV-cache events over a ZMQ PUB socket on `router.kvAware.eventsPort`
  (vllm/config/kv_events.py: enable_kv_cache_events, publisher, endpoint, topic), which only the router may reach
  (router/networkpolicy.yaml). The topic stays empty (vLLM's default): vllm-router 0.1.17 subscribes a static
  `--kv-event-source` with topic "" (src/config/mod.rs:54 in its sdist) and drops every frame whose topic is not
  exactly that (src/kv_index/subscriber.rs:179-186), so any other topic leaves kv_aware without events.
*/}}
{{- define "glm53.router.engineArgs" -}}
{{- $args := list }}
{{- if .Values.router.enabled }}{{ $args = append $args "--enable-scale-out" }}{{ end }}
{{- if include "glm53.router.kvAware" . }}
{{- $events := dict "enable_kv_cache_events" true "publisher" "zmq" "endpoint" (printf "tcp://*:%d" (int .Values.router.kvAware.eventsPort)) "topic" "" }}
{{- $args = concat $args (list "--kv-events-config" ($events | toJson)) }}
{{- end }}
{{- $args | toJson }}
{{- end }}

{{/*
`vllm-router` arguments (JSON list). Workers come from Kubernetes service discovery: pods matching the engine selector
in the release namespace, on the engine port. Worker health is GET /health (vllm_router/router_args.py:99, the
default we pass explicitly; vLLM answers 503 there when the engine died).
*/}}
{{- define "glm53.router.args" -}}
{{- $r := .Values.router }}
{{- $args := list "--host" "0.0.0.0" "--port" (toString (int $r.port)) }}
{{- $args = concat $args (list "--service-discovery" "--selector") (include "glm53.router.engineSelector" . | fromJsonArray) }}
{{- $args = concat $args (list "--service-discovery-port" (include "glm53.vllmPort" .) "--service-discovery-namespace" .Release.Namespace) }}
{{- $args = concat $args (list "--policy" $r.policy) }}
{{- if include "glm53.router.kvAware" . }}
{{- $args = concat $args (list "--kv-event-block-size" (include "glm53.router.kvEventBlockSize" .) "--kv-event-model" (include "glm53.servedModel" .)) }}
{{- range $r.kvAware.eventSources }}{{ $args = concat $args (list "--kv-event-source" .) }}{{ end }}
{{- end }}
{{- $h := $r.healthCheck }}
{{- $args = concat $args (list "--health-check-endpoint" "/health" "--health-check-interval-secs" (toString (int $h.intervalSeconds))) }}
{{- $args = concat $args (list "--health-check-timeout-secs" (toString (int $h.timeoutSeconds)) "--health-failure-threshold" (toString (int $h.failureThreshold))) }}
{{- $args = concat $args (list "--prometheus-host" "0.0.0.0" "--prometheus-port" (toString (int $r.metricsPort))) }}
{{- concat $args $r.extraArgs | toJson }}
{{- end }}
