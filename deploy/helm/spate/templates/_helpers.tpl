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

{{- /*
The Kafka listener's protocol when the config names it with `listeners` (a TLS Secret or a
protocol other than PLAINTEXT); empty keeps the `listen` shorthand of older releases.
*/}}
{{- define "spate.listenerProtocol" -}}
{{- $s := .Values.security | default dict -}}
{{- $tls := $s.tls | default dict -}}
{{- $p := $s.kafkaProtocol | default "PLAINTEXT" -}}
{{- if not (has $p (list "PLAINTEXT" "SSL" "SASL_PLAINTEXT" "SASL_SSL")) -}}
{{- fail (printf "security.kafkaProtocol is PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL, not %s" $p) -}}
{{- end -}}
{{- if and (has $p (list "SSL" "SASL_SSL")) (not $tls.secretName) -}}
{{- fail (printf "security.kafkaProtocol %s needs security.tls.secretName (a Secret holding tls.crt, tls.key and ca.crt)" $p) -}}
{{- end -}}
{{- if or $tls.secretName (ne $p "PLAINTEXT") -}}
{{- $p -}}
{{- end -}}
{{- end -}}

{{- /* "true" when the HTTP port serves HTTPS. */}}
{{- define "spate.httpTls" -}}
{{- $tls := (.Values.security | default dict).tls | default dict -}}
{{- if and $tls.secretName $tls.http -}}true{{- end -}}
{{- end -}}

{{- /* The settings security.* writes, as a YAML map of strings. */}}
{{- define "spate.securityKeys" -}}
{{- $s := .Values.security | default dict -}}
{{- $tls := $s.tls | default dict -}}
{{- $sasl := $s.sasl | default dict -}}
{{- $authz := $s.authorizer | default dict -}}
{{- $p := include "spate.listenerProtocol" . -}}
{{- if $p }}
listeners: {{ printf "%s://0.0.0.0:%v" $p .Values.listeners.kafka | quote }}
{{- end }}
{{- if $tls.secretName }}
{{- $auth := $tls.clientAuth | default "none" }}
{{- if not (has $auth (list "required" "requested" "none")) }}
{{- fail (printf "security.tls.clientAuth is required, requested or none, not %s" $auth) }}
{{- end }}
{{- if and (ne $auth "none") (ne $p "SSL") }}
{{- fail "security.tls.clientAuth applies to kafkaProtocol SSL only (SASL_SSL clients authenticate with SASL)" }}
{{- end }}
ssl-cert: "/etc/spate-tls/tls.crt"
ssl-key: "/etc/spate-tls/tls.key"
ssl-ca: "/etc/spate-tls/ca.crt"
ssl-client-auth: {{ $auth | quote }}
{{- /* interNode defaults to true: `default` would turn an explicit false into true. */}}
{{- if ne (toString $tls.interNode) "false" }}
cluster-tls: "true"
{{- end }}
{{- if $tls.http }}
http-tls: "true"
{{- end }}
{{- end }}
{{- with $sasl.mechanisms }}
sasl-mechanisms: {{ join "," . | quote }}
{{- end }}
{{- if $authz.enabled }}
authorizer: "acl"
{{- with $authz.superUsers }}
super-users: {{ join "," . | quote }}
{{- end }}
allow-everyone-if-no-acl-found: {{ toString ($authz.allowEveryoneIfNoAclFound | default false) | quote }}
{{- end }}
{{- end -}}

{{- define "spate.config" -}}
{{- $sec := include "spate.securityKeys" . | fromYaml | default dict -}}
# Written by the spate Helm chart.
data-dir = "/var/lib/spate/data"
{{- if not (hasKey $sec "listeners") }}
listen = "0.0.0.0:{{ .Values.listeners.kafka }}"
{{- end }}
http-listen = "0.0.0.0:{{ .Values.listeners.http }}"
{{- range $k, $v := $sec }}
{{ $k }} = {{ $v | toString | toJson }}
{{- end }}
{{- range $k, $v := .Values.config }}
{{- if has $k (list "node-id" "cluster-peers" "cluster-listen" "listen" "http-listen" "advertised-address" "advertised-http-address" "data-dir" "admin-token" "listeners" "advertised-listeners" "ssl-cert" "ssl-key" "ssl-ca" "cluster-tls" "http-tls") }}
{{- fail (printf "config.%s is set by the chart" $k) }}
{{- end }}
{{- if hasKey $sec $k }}
{{- fail (printf "config.%s is set by the chart from security.*: set it there" $k) }}
{{- end }}
{{ $k }} = {{ $v | toString | toJson }}
{{- end }}
{{- end -}}
