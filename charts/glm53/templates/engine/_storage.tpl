{{/*
Engine storage: how each serving pod gets a weights volume it can mount. Each replica's TP group fills a GPU node (a
GLM-5.3 replica a whole 8-GPU node), so replicas land on different nodes, and one ReadWriteOnce claim attaches to one
node only: the replicas past the first would hang in ContainerCreating (Multi-Attach error). So:
- weights.source=newPvc, replicaCount 1: a Deployment and one claim (weights-pvc.yaml), as always.
- weights.source=newPvc, replicaCount > 1 (not in mock mode): a StatefulSet whose volumeClaimTemplate gives every
  replica its own claim, `weights-<fullname>-<ordinal>` (statefulset.yaml); each replica downloads its own copy.
- existingPvc: a Deployment sharing the claim; with replicaCount > 1 the guards require a declared ReadOnlyMany or
  ReadWriteMany access mode (weights.existingClaimAccessMode).
- hostPath and none: a Deployment; the volume is node-local (hostPath) or per pod (emptyDir), so replicas never share.
*/}}

{{/* "true" when every replica gets its own weights claim from a StatefulSet's volumeClaimTemplate; "" otherwise. */}}
{{- define "glm53.engine.perReplicaClaims" -}}
{{- if and (eq .Values.weights.source "newPvc") (not .Values.mock.enabled) (gt (int .Values.replicaCount) 1) }}true{{ end }}
{{- end }}

{{/* The StatefulSet's governing headless Service: it gives each replica the DNS name <pod>.<this>.<namespace>.svc. */}}
{{- define "glm53.engine.headlessServiceName" -}}
{{- printf "%s-headless" (include "glm53.fullname" . | trunc 54 | trimSuffix "-") }}
{{- end }}

{{/* The spec of a weights claim from weights.newPvc: the single claim (weights-pvc.yaml) and the per-replica
volumeClaimTemplate (statefulset.yaml) are the same claim, once or once per replica. */}}
{{- define "glm53.weightsClaimSpec" -}}
accessModes:
  {{- toYaml .Values.weights.newPvc.accessModes | nindent 2 }}
{{- with .Values.weights.newPvc.storageClassName }}
storageClassName: {{ . }}
{{- end }}
resources:
  requests:
    storage: {{ .Values.weights.newPvc.size }}
{{- end }}

{{/* Which weights volume the pod mounts: "" for none. Mock mode loads no weights, so it never gets the chart's PVC. */}}
{{- define "glm53.weightsClaimName" -}}
{{- if and (eq .Values.weights.source "newPvc") (not .Values.mock.enabled) }}{{ include "glm53.fullname" . }}-weights{{ else if eq .Values.weights.source "existingPvc" }}{{ .Values.weights.existingClaim }}{{ end }}
{{- end }}
