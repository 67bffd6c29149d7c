{{/* tsingress.settings: the operator-settings ConfigMap's data, as YAML. */}}
{{- define "tsingress.settings" -}}
{{- $s := dict
  "PROXY_TAGS" .Values.proxyConfig.defaultTags
  "PROXY_FIREWALL_MODE" .Values.proxyConfig.firewallMode
  "OPERATOR_INGRESS_CLASS_NAME" .Values.ingressClass.name
  "PROXY_IMAGE" (include "tsingress.image" (list .Values.proxyConfig.image .)) }}
{{- with .Values.proxyConfig.defaultProxyClass }}{{ $_ := set $s "PROXY_DEFAULT_CLASS" . }}{{ end }}
{{- with .Values.loginServer }}{{ $_ := set $s "OPERATOR_LOGIN_SERVER" . }}{{ end }}
{{- with .Values.proxyConfig.privilegedNamespace }}{{ $_ := set $s "OPERATOR_PRIVILEGED_PROXY_NAMESPACE" . }}{{ end }}
{{- range $k, $v := .Values.operatorSettings }}
{{- if hasKey $s $k }}
{{- fail (printf "operatorSettings.%s: %s is set by a value of the chart (see values.yaml); set that value instead" $k $k) }}
{{- end }}
{{- if has $k (list "OPERATOR_NAMESPACE" "CLIENT_ID_FILE" "CLIENT_SECRET_FILE") }}
{{- fail (printf "operatorSettings.%s: the chart sets %s itself (the release's namespace, the OAuth volume's files)" $k $k) }}
{{- end }}
{{- $_ := set $s $k (toString $v) }}
{{- end }}
{{- toYaml $s }}
{{- end }}
