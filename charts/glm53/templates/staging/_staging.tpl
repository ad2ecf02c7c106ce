{{/*
The stage step (weights.staging): `glm53 stage-weights run` downloads the served model's repository at weights.revision
into the Hugging Face cache on the weights volume before anything else in the pod starts, resumably, verifies every
file against the hashes the hub lists, and writes a completion marker; the engine then runs offline. It is the pod's
first init container, a native sidecar (restartPolicy Always) rather than a plain one, and not a Job:
- its startup probe (`glm53 stage-weights status`) holds the LMCache sidecar and the engine back until the weights
  are verified, and the kubelet writes each failed run's line into the pod's events: progress (bytes, files, rate,
  ETA) while it downloads, and the reason (no network, a missing token, a wrong revision) when an attempt failed;
- a failed attempt is retried inside the running container with a growing pause, so the pod never enters
  Init:CrashLoopBackOff, and a Secret fixed meanwhile is read at the next attempt (the kubelet updates mounted Secrets);
- it serves its own metrics for the pod's whole life (bytes staged, done, failed);
- in the pod it mounts the very volume the engine reads, whichever it is: the single claim, each StatefulSet replica's
  own claim (weights-<fullname>-<ordinal>), a node directory, an emptyDir. A Job could not mount a replica's
  ReadWriteOnce claim on the replica's node, and a Helm hook would hold `helm install` for hours.
A restart or a rolling update finds the marker and downloads nothing (weights.staging.reverify).
*/}}

{{/* "true" when the stage step renders: on, the volume writable (weights.readOnly=true means pre-staged), and, in mock
mode, only for the real CPU engine with a hub stand-in to stage from (the stand-in engine loads no weights). */}}
{{- define "glm53.staging.enabled" -}}
{{- $s := .Values.weights.staging }}
{{- if and $s.enabled (not .Values.weights.readOnly) }}
{{- if not .Values.mock.enabled }}true{{ else if and (include "glm53.realCpuEngine" .) $s.endpoint }}true{{ end }}
{{- end }}
{{- end }}

{{- define "glm53.staging.statusFile" -}}{{ include "glm53.logDir" . }}/stage/status.json{{- end }}

{{/* The engine container's arguments: the chart's, plus `--revision` when it is not the hub's default branch (offline,
vLLM resolves the revision through the ref the stage step wrote; vLLM 0.33 ModelConfig.revision). Not in mock mode,
where the real CPU engine loads the staged snapshot by path. */}}
{{- define "glm53.staging.vllmContainerArgs" -}}
{{- $args := include "glm53.vllmContainerArgs" . | fromJsonArray }}
{{- if and (not .Values.mock.enabled) (ne .Values.weights.revision "main") }}
{{- $args = concat $args (list "--revision" .Values.weights.revision) }}
{{- end }}
{{- toJson $args }}
{{- end }}

{{- define "glm53.staging.args" -}}
{{- $s := .Values.weights.staging }}
{{- $args := list "--repo" (include "glm53.model" .) "--revision" .Values.weights.revision }}
{{- $args = concat $args (list "--cache-dir" (printf "%s/huggingface/hub" .Values.weights.mountPath)) }}
{{- with $s.endpoint }}{{ $args = concat $args (list "--endpoint" .) }}{{ end }}
{{- if .Values.weights.hfTokenSecret.name }}
{{- $args = concat $args (list "--token-file" (printf "%s/%s" (include "glm53.hfTokenDir" .) .Values.weights.hfTokenSecret.key)) }}
{{- end }}
{{- $args = concat $args (list "--max-workers" (toString $s.maxWorkers) "--reverify" $s.reverify) }}
{{- $args = concat $args (list "--progress-seconds" (toString $s.progressSeconds) "--status-file" (include "glm53.staging.statusFile" .)) }}
{{- $args = concat $args (list "--metrics-host" (ternary "0.0.0.0" (include "glm53.loopback" .) $s.metrics.expose) "--metrics-port" (toString $s.metrics.port)) }}
{{- if .Values.mock.enabled }}
{{- /* The real CPU engine loads its model by path (glm53.tinyModelDir): that path becomes a link to the snapshot. */}}
{{- $args = concat $args (list "--link" (include "glm53.tinyModelDir" .)) }}
{{- end }}
{{- append $args "--keep-running" | toJson }}
{{- end }}

{{/* The stage container, first of the engine pod's init containers (engine/_pod.tpl). */}}
{{- define "glm53.staging.initContainer" -}}
{{- $s := .Values.weights.staging }}
{{- if hasPrefix "/" (include "glm53.model" .) }}
{{- fail (printf "vllm.model=%s is a path, but the stage step downloads a hub repository; set weights.staging.enabled=false (the weights are already on the volume) or vllm.model to a repository id" (include "glm53.model" .)) }}
{{- end }}
{{- $taken := include "glm53.reservedPorts" . | fromJsonArray }}
{{- if .Values.exporter.enabled }}{{ $taken = append $taken (toString (int .Values.exporter.port)) }}{{ end }}
{{- if has (toString (int $s.metrics.port)) $taken }}
{{- fail (printf "weights.staging.metrics.port=%d collides with a port another container of the pod listens on (%s); choose another, e.g. the default 9402" (int $s.metrics.port) (join ", " $taken)) }}
{{- end }}
# The stage step (_staging.tpl says why it is a native sidecar): downloads and verifies the weights, then serves its
# status and metrics; the LMCache sidecar and the engine start only after its startup probe passed.
- name: stage-weights
  image: {{ include "glm53.image" . }}
  imagePullPolicy: {{ include "glm53.imagePullPolicy" . }}
  restartPolicy: Always
  command: ["/usr/bin/tini", "--", "glm53", "stage-weights", "run"]
  args:
    {{- include "glm53.staging.args" . | fromJsonArray | toYaml | nindent 4 }}
  {{- if $s.metrics.expose }}
  ports:
    - name: stage-metrics
      containerPort: {{ $s.metrics.port }}
      protocol: TCP
  {{- end }}
  env:
    {{- include "glm53.baseEnv" . | nindent 4 }}
    - name: HF_HOME
      value: {{ .Values.weights.mountPath }}/huggingface
    # The resumable path is plain HTTP with Range (glm53.staging.hub); the client's Xet transfers do not resume a
    # killed process's file (huggingface_hub 2.4.0 file_download.py:1996-2046).
    - name: HF_HUB_DISABLE_XET
      value: "1"
    - name: HF_HUB_DISABLE_TELEMETRY
      value: "1"
    {{- with $s.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  startupProbe:
    exec:
      command: ["glm53", "stage-weights", "status", "--status-file", {{ include "glm53.staging.statusFile" . | quote }}]
    periodSeconds: {{ $s.probe.periodSeconds }}
    timeoutSeconds: {{ $s.probe.timeoutSeconds }}
    failureThreshold: {{ $s.probe.failureThreshold }}
  # If the container ever exits on an error, `kubectl describe pod` shows the end of its log as the reason.
  terminationMessagePolicy: FallbackToLogsOnError
  resources:
    {{- toYaml $s.resources | nindent 4 }}
  securityContext:
    {{- include "glm53.containerSecurityContext" . | nindent 4 }}
  volumeMounts:
    {{- include "glm53.volumeMounts.logs" . | nindent 4 }}
    - name: tmp
      mountPath: /tmp
    - name: weights
      mountPath: {{ .Values.weights.mountPath }}
    {{- if .Values.weights.hfTokenSecret.name }}
    - name: hf-token
      mountPath: {{ include "glm53.hfTokenDir" . }}
      readOnly: true
    {{- end }}
{{- end }}
