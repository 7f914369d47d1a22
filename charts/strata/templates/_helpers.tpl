{{- define "strata.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-scoped name of every object; suffixes are added to a 50-character stem at most. */}}
{{- define "strata.fullname" -}}
{{- if .Values.fullnameOverride }}{{ .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}{{ .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}{{ printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}{{ end }}
{{- end }}
{{- end }}

{{- define "strata.labels" -}}
app.kubernetes.io/name: strata-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "strata.selectorLabels" -}}
app.kubernetes.io/name: strata-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "strata.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}{{ default (include "strata.fullname" .) .Values.serviceAccount.name }}
{{- else }}{{ default "default" .Values.serviceAccount.name }}{{ end }}
{{- end }}

{{/* One ClusterKopfPeering per release, so two releases never pause each other. */}}
{{- define "strata.peeringName" -}}
{{- default (include "strata.fullname" .) .Values.operator.peering.name }}
{{- end }}

{{- define "strata.peered" -}}
{{- if and .Values.operator.peering.enabled (gt (int .Values.operator.replicas) 1) }}true{{ end }}
{{- end }}

{{- define "strata.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
