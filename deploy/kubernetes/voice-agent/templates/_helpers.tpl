{{/* Names, labels and the pieces every Deployment shares. */}}

{{- define "va.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "va.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" $ "component" "gateway") */}}
{{- define "va.selector" -}}
app.kubernetes.io/name: {{ .ctx.Chart.Name }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* Whether the engines run on GPUs (the dual-gpu profile), or on the CPU (lite, fake). */}}
{{- define "va.gpu" -}}
{{- if eq .Values.profile "dual-gpu" -}}true{{- end -}}
{{- end -}}

{{/*
The image of one component: (dict "ctx" $ "own" .Values.asr.image "component" "asr").
Its own repository/tag, else the chart's; the tag defaults to <appVersion>-<variant>, the
images scripts/build_images.sh builds (docs/containers.md): `lite` for the gateway and for
CPU engines, `gpu` for the ASR and `chatterbox` for the TTS on the dual-gpu profile.
*/}}
{{- define "va.image" -}}
{{- $own := .own | default dict -}}
{{- $variant := "lite" -}}
{{- if and (include "va.gpu" .ctx) (eq .component "asr") -}}{{- $variant = "gpu" -}}{{- end -}}
{{- if and (include "va.gpu" .ctx) (eq .component "tts") -}}{{- $variant = "chatterbox" -}}{{- end -}}
{{- $repo := $own.repository | default .ctx.Values.image.repository -}}
{{- $tag := $own.tag | default .ctx.Values.image.tag | default (printf "%s-%s" .ctx.Chart.AppVersion $variant) -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}

{{- define "va.pullPolicy" -}}
{{- $own := .own | default dict -}}
{{- $own.pullPolicy | default .ctx.Values.image.pullPolicy -}}
{{- end -}}

{{- define "va.redisSecret" -}}
{{- if .Values.redis.existingSecret -}}
{{- .Values.redis.existingSecret -}}
{{- else if .Values.redis.url -}}
{{- printf "%s-redis" (include "va.fullname" .) -}}
{{- else -}}
{{- fail "set redis.existingSecret (a Secret holding VA_REDIS__URL) or redis.url" -}}
{{- end -}}
{{- end -}}

{{/* Environment every service gets: profile, log level, Redis from the Secret. */}}
{{- define "va.commonEnv" -}}
- name: VA_PROFILE
  value: {{ .Values.profile | quote }}
- name: VA_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
- name: VA_REDIS__URL
  valueFrom:
    secretKeyRef:
      name: {{ include "va.redisSecret" . }}
      key: {{ .Values.redis.secretKey }}
- name: VA_REDIS__PREFIX
  value: {{ .Values.redis.prefix | quote }}
- name: HF_HUB_OFFLINE
  value: "1"
- name: PYTHONUNBUFFERED
  value: "1"
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "va.podAnnotations" -}}
{{- if .ctx.Values.metrics.podAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- with .own }}
{{ toYaml . }}
{{- end }}
{{- end -}}
