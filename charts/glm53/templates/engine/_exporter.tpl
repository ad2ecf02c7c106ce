{{/* The engine pod's exporter container (exporter.enabled): `glm53 exporter` reads the servers' logs and scrapes vLLM's
and every LMCache server's metrics over loopback. */}}

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
