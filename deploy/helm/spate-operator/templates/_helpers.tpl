{{- define "spate-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "spate-operator.labels" -}}
app.kubernetes.io/name: spate-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "spate-operator.selector" -}}
app.kubernetes.io/name: spate-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "spate-operator.serviceAccount" -}}
{{- default (include "spate-operator.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}
