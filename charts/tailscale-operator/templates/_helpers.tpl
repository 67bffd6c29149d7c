{{/* Labels helm adds to every object it renders (not to selectors or the Pod template). */}}
{{- define "tsingress.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* tsingress.image: repository@digest, else repository:tag, else repository:appVersion. */}}
{{- define "tsingress.image" -}}
{{- $img := index . 0 -}}
{{- if $img.digest -}}
{{ $img.repository }}@{{ $img.digest }}
{{- else -}}
{{ $img.repository }}:{{ $img.tag | default (index . 1).Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/*
tsingress.generated renders the objects of a file hack/chart-files.sh wrote from config/: in the
release's namespace where kustomize's placeholder (system) stands, with the chart's labels, and
the annotations given (a dict) merged in.
*/}}
{{- define "tsingress.generated" -}}
{{- $root := index . 0 -}}
{{- $annotations := index . 2 -}}
{{- range $doc := regexSplit "(?m)^---$" ($root.Files.Get (index . 1)) -1 }}
{{- $obj := fromYaml $doc }}
{{- if $obj.kind }}
{{- $meta := $obj.metadata }}
{{- if $meta.namespace }}
{{- $_ := set $meta "namespace" $root.Release.Namespace }}
{{- end }}
{{- $_ := set $meta "labels" (merge (dict) (include "tsingress.labels" $root | fromYaml) ($meta.labels | default dict)) }}
{{- with (get $annotations $obj.kind) }}
{{- $_ := set $meta "annotations" (merge (dict) . ($meta.annotations | default dict)) }}
{{- end }}
{{- range $obj.subjects | default list }}
{{- if eq .kind "ServiceAccount" }}
{{- $_ := set . "namespace" $root.Release.Namespace }}
{{- end }}
{{- end }}
---
{{ toYaml $obj }}
{{- end }}
{{- end }}
{{- end }}
