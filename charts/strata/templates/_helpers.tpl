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

{{/* Cluster-scoped objects (ClusterRoles and their bindings, the ClusterKopfPeering) carry the
     release namespace too: Helm release names are unique only within a namespace, and two
     releases named "strata" in two namespaces must not fight over one ClusterRole. */}}
{{- define "strata.clusterName" -}}
{{- printf "%s-%s" (include "strata.fullname" .) .Release.Namespace | trunc 253 | trimSuffix "-" }}
{{- end }}

{{/* One ClusterKopfPeering per release, so two releases never pause each other. */}}
{{- define "strata.peeringName" -}}
{{- default (include "strata.clusterName" .) .Values.operator.peering.name }}
{{- end }}

{{- define "strata.peered" -}}
{{- if and .Values.operator.peering.enabled (gt (int .Values.operator.replicas) 1) }}
{{- if .Values.operator.watchNamespaces }}
{{- fail "operator.watchNamespaces: an operator limited to namespaces peers through namespaced KopfPeerings, which this chart does not install, and runs no autoscaler with them; set operator.replicas=1 (or operator.peering.enabled=false)" }}
{{- end }}true{{ end }}
{{- end }}

{{- define "strata.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
