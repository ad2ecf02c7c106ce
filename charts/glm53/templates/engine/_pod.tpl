{{/*
The engine pod template, shared by the two workloads that can run it: the Deployment (deployment.yaml) and, for
weights.source=newPvc with replicaCount > 1, the StatefulSet (statefulset.yaml). Exactly one of them renders
(glm53.engine.perReplicaClaims), so the pod is the same whichever runs it. Include with `nindent 4` under `template:`.
*/}}
{{- define "glm53.engine.podTemplate" -}}
{{- $mock := .Values.mock.enabled }}
{{- $real := include "glm53.realCpuEngine" . }}
{{- $dra := and .Values.dra.enabled (not $mock) }}
{{- $stage := include "glm53.staging.enabled" . }}
{{- $ctx := dict "ctx" . "component" "engine" -}}
metadata:
  labels:
    {{- include "glm53.labels" $ctx | nindent 4 }}
  {{- with .Values.podAnnotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  serviceAccountName: {{ include "glm53.serviceAccountName" . }}
  automountServiceAccountToken: false
  enableServiceLinks: false
  terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
  securityContext:
    {{- include "glm53.podSecurityContext" . | nindent 4 }}
  {{- if and (not $mock) .Values.runtimeClassName }}
  runtimeClassName: {{ .Values.runtimeClassName }}
  {{- end }}
  {{- with .Values.imagePullSecrets }}
  imagePullSecrets:
    {{- range . }}
    - name: {{ . }}
    {{- end }}
  {{- end }}
  {{- $nodeSelector := deepCopy .Values.nodeSelector }}
  {{- if and (not $mock) .Values.placement.gpuProduct }}
  {{- $_ := set $nodeSelector .Values.placement.gpuProductLabel .Values.placement.gpuProduct }}
  {{- end }}
  {{- with $nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- $tolerations := .Values.tolerations }}
  {{- if not $mock }}{{ $tolerations = concat .Values.placement.tolerations .Values.tolerations }}{{ end }}
  {{- with $tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- if $dra }}
  # One claim per pod (from the template), referenced by the engine and the sidecar: both see exactly these GPUs.
  resourceClaims:
    - name: gpus
      resourceClaimTemplateName: {{ include "glm53.fullname" . }}-gpus
  {{- end }}
  {{- if or .Values.lmcache.enabled $real $stage }}
  initContainers:
    {{- if $stage }}{{ include "glm53.staging.initContainer" . | nindent 4 }}{{ end }}
    {{- if and $real (not $stage) }}
    # The real CPU engine's model, made in the pod before anything else starts (no hub is reached): a tokenizer
    # trained here, a config and seeded weights (glm53.tinymodels).
    - name: tiny-model
      image: {{ include "glm53.image" . }}
      imagePullPolicy: {{ include "glm53.imagePullPolicy" . }}
      command: ["glm53", "tiny-model"]
      args: ["--shape", {{ (include "glm53.profile" . | fromJson).tinyModel.shape | quote }}, "--out", {{ include "glm53.tinyModelDir" . | quote }}]
      env:
        {{- include "glm53.baseEnv" . | nindent 8 }}
      resources:
        {{- toYaml .Values.mock.lmcacheResources | nindent 8 }}
      securityContext:
        {{- include "glm53.containerSecurityContext" . | nindent 8 }}
      volumeMounts:
        - name: tmp
          mountPath: /tmp
        - name: weights
          mountPath: {{ .Values.weights.mountPath }}
    {{- end }}
    {{- if .Values.lmcache.enabled }}
    {{- range include "glm53.lmcacheServers" . | fromJsonArray }}
    {{- include "glm53.engine.lmcacheSidecar" (dict "ctx" $ "server" .) | nindent 4 }}
    {{- end }}
    {{- end }}
  {{- end }}
  containers:
    - name: vllm
      image: {{ include "glm53.image" . }}
      imagePullPolicy: {{ include "glm53.imagePullPolicy" . }}
      command: {{ include "glm53.supervisorCommand" . }}
      args:
        {{- include "glm53.staging.vllmContainerArgs" . | fromJsonArray | toYaml | nindent 8 }}
      ports:
        - name: http
          containerPort: {{ include "glm53.vllmPort" . }}
          protocol: TCP
      env:
        {{- include "glm53.baseEnv" . | nindent 8 }}
        {{- include "glm53.envFromMap" .Values.vllm.telemetryEnv | nindent 8 }}
        {{- with .Values.vllm.apiKeySecret.name }}
        # vLLM 0.33 reads VLLM_API_KEY when no --api-key is given (vllm/entrypoints/serve/middleware/register.py:33).
        - name: VLLM_API_KEY
          valueFrom:
            secretKeyRef:
              name: {{ . }}
              key: {{ $.Values.vllm.apiKeySecret.key }}
        {{- end }}
        - name: HF_HOME
          value: {{ .Values.weights.mountPath }}/huggingface
        {{- if or .Values.weights.offline $real $stage }}
        - name: HF_HUB_OFFLINE
          value: "1"
        {{- end }}
        {{- if $real }}
        # vLLM's CPU backend sizes its KV cache from this (GiB), not from a GPU memory fraction.
        - name: VLLM_CPU_KVCACHE_SPACE
          value: {{ .Values.mock.realEngine.kvCacheGib | quote }}
        {{- end }}
        {{- if .Values.weights.hfTokenSecret.name }}
        # The token is read from a mounted file, never from an environment variable.
        - name: HF_TOKEN_PATH
          value: {{ include "glm53.hfTokenDir" . }}/{{ .Values.weights.hfTokenSecret.key }}
        {{- end }}
        {{- if or .Values.validation.enabled .Values.vllm.devMode }}
        # UNSAFE FOR PRODUCTION: unauthenticated /reset_prefix_cache and the other dev and RL routes (vllm 0.33
        # vllm/entrypoints/launchers/api_server/routers.py:46-53), for `helm test` validation only.
        - name: VLLM_SERVER_DEV_MODE
          value: "1"
        {{- end }}
        {{- if .Values.vllm.batchInvariant }}
        - name: VLLM_BATCH_INVARIANT
          value: "1"
        {{- end }}
        {{- with .Values.vllm.extraEnv }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      startupProbe:
        {{- if .Values.lmcache.enabled }}
        # Exit 0 Ready; 3 still loading and 4 wrong geometry / failed server are both failures to the kubelet:
        # read the probe's one-line message in `kubectl describe pod` events.
        exec:
          command:
            {{- include "glm53.startupProbeCommand" . | fromJsonArray | toYaml | nindent 12 }}
        {{- else }}
        httpGet:
          path: /health
          port: http
        {{- end }}
        periodSeconds: {{ .Values.probes.startup.periodSeconds }}
        timeoutSeconds: {{ .Values.probes.startup.timeoutSeconds }}
        failureThreshold: {{ .Values.probes.startup.failureThreshold }}
      readinessProbe:
        exec:
          command:
            {{- include "glm53.vllmReadinessCommand" . | fromJsonArray | toYaml | nindent 12 }}
        periodSeconds: {{ .Values.probes.readiness.periodSeconds }}
        timeoutSeconds: {{ .Values.probes.readiness.timeoutSeconds }}
        failureThreshold: {{ .Values.probes.readiness.failureThreshold }}
      livenessProbe:
        httpGet:
          path: /health
          port: http
        periodSeconds: {{ .Values.probes.liveness.periodSeconds }}
        timeoutSeconds: {{ .Values.probes.liveness.timeoutSeconds }}
        failureThreshold: {{ .Values.probes.liveness.failureThreshold }}
      resources:
        {{- if $real }}
        {{- toYaml .Values.mock.realEngine.resources | nindent 8 }}
        {{- else if $mock }}
        {{- toYaml .Values.mock.vllmResources | nindent 8 }}
        {{- else }}
        {{- $gpus := include "glm53.gpus" . }}
        requests:
          {{- toYaml .Values.vllm.resources.requests | nindent 10 }}
          {{- if not $dra }}
          nvidia.com/gpu: {{ $gpus }}
          {{- end }}
        limits:
          {{- toYaml .Values.vllm.resources.limits | nindent 10 }}
          {{- if not $dra }}
          nvidia.com/gpu: {{ $gpus }}
          {{- end }}
        {{- if $dra }}
        claims:
          - name: gpus
        {{- end }}
        {{- end }}
      securityContext:
        {{- include "glm53.containerSecurityContext" . | nindent 8 }}
      volumeMounts:
        {{- include "glm53.volumeMounts.logs" . | nindent 8 }}
        {{- include "glm53.volumeMounts.runtime" . | nindent 8 }}
        - name: weights
          mountPath: {{ .Values.weights.mountPath }}
          readOnly: {{ .Values.weights.readOnly }}
        {{- if .Values.weights.hfTokenSecret.name }}
        - name: hf-token
          mountPath: {{ include "glm53.hfTokenDir" . }}
          readOnly: true
        {{- end }}
    {{- if .Values.exporter.enabled }}
    - name: exporter
      image: {{ include "glm53.image" . }}
      imagePullPolicy: {{ include "glm53.imagePullPolicy" . }}
      command: ["glm53", "exporter"]
      args:
        {{- include "glm53.exporterArgs" . | fromJsonArray | toYaml | nindent 8 }}
      ports:
        - name: metrics
          containerPort: {{ .Values.exporter.port }}
          protocol: TCP
      env:
        {{- include "glm53.baseEnv" . | nindent 8 }}
      readinessProbe:
        tcpSocket:
          port: metrics
        periodSeconds: 10
      livenessProbe:
        tcpSocket:
          port: metrics
        periodSeconds: 20
      resources:
        {{- toYaml .Values.exporter.resources | nindent 8 }}
      securityContext:
        {{- include "glm53.containerSecurityContext" . | nindent 8 }}
      volumeMounts:
        - name: logs
          mountPath: {{ include "glm53.logDir" . }}
          readOnly: true
        - name: tmp
          mountPath: /tmp
        {{- include "glm53.volumeMounts.lmcacheApiKey" . | nindent 8 }}
    {{- end }}
  volumes:
    - name: logs
      emptyDir:
        sizeLimit: {{ .Values.logVolumeSize }}
    - name: tmp
      emptyDir: {}
    - name: shm
      emptyDir:
        medium: Memory
        sizeLimit: {{ .Values.shmSize }}
    {{- if and .Values.lmcache.enabled (eq .Values.lmcache.l2.type "fs") }}
    # LMCache's fs L2 tier: on the node's disk, kept across container restarts; its janitor stays below the limit.
    - name: lmcache-l2
      emptyDir:
        sizeLimit: {{ .Values.lmcache.l2.fs.sizeGi }}Gi
    {{- end }}
    {{- if not (include "glm53.engine.perReplicaClaims" .) }}
    {{- /* With per-replica claims the StatefulSet's volumeClaimTemplate supplies `weights` (statefulset.yaml). */}}
    - name: weights
      {{- $claim := include "glm53.weightsClaimName" . }}
      {{- if $claim }}
      persistentVolumeClaim:
        claimName: {{ $claim }}
        readOnly: {{ .Values.weights.readOnly }}
      {{- else if eq .Values.weights.source "hostPath" }}
      hostPath:
        path: {{ .Values.weights.hostPath }}
        type: Directory
      {{- else }}
      emptyDir: {}
      {{- end }}
    {{- end }}
    {{- if include "glm53.lmcacheApiKey" . }}
    - name: lmcache-api-key
      secret:
        secretName: {{ .Values.lmcache.apiKey.secretName }}
        defaultMode: 0440
        items:
          - key: {{ .Values.lmcache.apiKey.secretKey }}
            path: {{ .Values.lmcache.apiKey.secretKey }}
    {{- end }}
    {{- with .Values.weights.hfTokenSecret.name }}
    - name: hf-token
      secret:
        secretName: {{ . }}
        defaultMode: 0440
        items:
          - key: {{ $.Values.weights.hfTokenSecret.key }}
            path: {{ $.Values.weights.hfTokenSecret.key }}
    {{- end }}
{{- end }}

{{/*
One LMCache server as a native sidecar: restartPolicy Always makes the kubelet start the next container (the next
server, then vLLM) only after this one's startup probe passed, and stop it only after vLLM exited. Rendered once per
entry of glm53.lmcacheServers (lmcache.serverLayout): call with (dict "ctx" $ "server" SERVER).
*/}}
{{- define "glm53.engine.lmcacheSidecar" -}}
{{- $ctx := .ctx }}{{ $s := .server }}
{{- $mock := $ctx.Values.mock.enabled }}
{{- $dra := and $ctx.Values.dra.enabled (not $mock) }}
{{- $l := $ctx.Values.lmcache }}
{{- $probes := $ctx.Values.probes.lmcache -}}
# Native sidecar: restartPolicy Always makes the kubelet start the next container only after this container's startup
# probe passed, and stop it only after vLLM exited.
- name: {{ $s.name }}
  image: {{ include "glm53.image" $ctx }}
  imagePullPolicy: {{ include "glm53.imagePullPolicy" $ctx }}
  restartPolicy: Always
  command: {{ include "glm53.supervisorCommand" $ctx }}
  args:
    {{- include "glm53.lmcacheContainerArgs" . | fromJsonArray | toYaml | nindent 4 }}
  env:
    {{- include "glm53.baseEnv" $ctx | nindent 4 }}
    {{- include "glm53.envFromMap" $l.telemetryEnv | nindent 4 }}
    {{- if and (not $mock) (not $dra) }}
    # CUDA IPC: see lmcache.gpuAccess in values.yaml (no GPU request; visibility through the NVIDIA runtime).
    - name: NVIDIA_VISIBLE_DEVICES
      value: {{ ternary "all" "void" (eq $l.gpuAccess "visibleDevices") }}
    {{- end }}
    {{- include "glm53.lmcacheL2Env" $ctx | nindent 4 }}
    {{- with $l.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  startupProbe:
    exec:
      command:
        {{- include "glm53.lmcacheHealthCommand" . | fromJsonArray | toYaml | nindent 8 }}
    periodSeconds: {{ $probes.periodSeconds }}
    timeoutSeconds: {{ $probes.timeoutSeconds }}
    failureThreshold: {{ $probes.startupFailureThreshold }}
  livenessProbe:
    exec:
      command:
        {{- include "glm53.lmcacheHealthCommand" . | fromJsonArray | toYaml | nindent 8 }}
    periodSeconds: {{ $probes.periodSeconds }}
    timeoutSeconds: {{ $probes.timeoutSeconds }}
    failureThreshold: {{ $probes.livenessFailureThreshold }}
  resources:
    {{- if $mock }}
    {{- toYaml $ctx.Values.mock.lmcacheResources | nindent 4 }}
    {{- else }}
    {{- /* Each server holds its own share of the L1 (glm53.lmcacheL1PerServer) plus its own process overhead. */}}
    {{- $memory := printf "%dGi" (add (ceil (include "glm53.lmcacheL1PerServer" $ctx | float64) | int) (int $l.memoryOverheadGi)) }}
    requests:
      cpu: {{ $l.cpu | quote }}
      memory: {{ $memory }}
      {{- if and (eq $l.l2.type "fs") (eq (int $s.index) 0) }}
      # The pod's fs L2 tier (an emptyDir), requested once so the scheduler finds a node with the disk.
      ephemeral-storage: {{ $l.l2.fs.sizeGi }}Gi
      {{- end }}
    limits:
      memory: {{ $memory }}
    {{- if $dra }}
    claims:
      - name: gpus
    {{- end }}
    {{- end }}
  securityContext:
    {{- include "glm53.containerSecurityContext" $ctx | nindent 4 }}
  volumeMounts:
    {{- include "glm53.volumeMounts.logs" $ctx | nindent 4 }}
    {{- include "glm53.volumeMounts.runtime" $ctx | nindent 4 }}
    {{- include "glm53.volumeMounts.lmcacheApiKey" $ctx | nindent 4 }}
    {{- include "glm53.volumeMounts.lmcacheL2" $ctx | nindent 4 }}
{{- end }}
