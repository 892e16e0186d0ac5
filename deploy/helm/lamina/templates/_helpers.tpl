{{/*
The prefix of every object's name: the release name when it contains the
chart's name (release "lamina" gives lamina-controller, lamina-node, ...),
else RELEASE-lamina.
*/}}
{{- define "lamina.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object. Helm's own labels are left out in standalone mode (deploy/kubernetes). */}}
{{- define "lamina.labels" -}}
app.kubernetes.io/name: lamina
{{- if not .Values.standalone }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}
{{- end -}}

{{/* Labels that select the pods of one component (argument: dict "root" . "component" NAME). */}}
{{- define "lamina.selectorLabels" -}}
app.kubernetes.io/name: lamina
{{- if not .root.Values.standalone }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The lamina image. */}}
{{- define "lamina.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* Where kubelet finds the node plugin's socket. */}}
{{- define "lamina.pluginDir" -}}
{{- printf "%s/plugins/%s" (trimSuffix "/" .Values.kubeletDir) .Values.driverName -}}
{{- end -}}

{{/* The nodes Lamina's pods run on: Linux nodes matching .Values.nodeSelector. */}}
{{- define "lamina.nodeSelector" -}}
{{- toYaml (merge (dict "kubernetes.io/os" "linux") .Values.nodeSelector) -}}
{{- end -}}

{{/* "true" when the CSI controller drives every node of the node Secrets: controller.nodesFromSecrets, or multiNode.enabled (whose nodes register themselves). */}}
{{- define "lamina.nodesFromSecrets" -}}
{{- if or .Values.controller.nodesFromSecrets .Values.multiNode.enabled -}}true{{- end -}}
{{- end -}}
