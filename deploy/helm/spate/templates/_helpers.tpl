{{- define "spate.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "spate.selector" -}}
app.kubernetes.io/name: spate
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "spate.labels" -}}
{{ include "spate.selector" . }}
app.kubernetes.io/component: broker
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "spate.config" -}}
# Written by the spate Helm chart.
data-dir = "/var/lib/spate/data"
listen = "0.0.0.0:{{ .Values.listeners.kafka }}"
http-listen = "0.0.0.0:{{ .Values.listeners.http }}"
{{- range $k, $v := .Values.config }}
{{- if has $k (list "node-id" "cluster-peers" "cluster-listen" "listen" "http-listen" "advertised-address" "advertised-http-address" "data-dir" "admin-token") }}
{{- fail (printf "config.%s is set by the chart" $k) }}
{{- end }}
{{ $k }} = {{ $v | toString | toJson }}
{{- end }}
{{- end -}}
