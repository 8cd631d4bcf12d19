{{/*
An engine (ASR or TTS): a Deployment and a Service. On the dual-gpu profile it runs on one
GPU, its models from the PVC (filled by an init container running `voice-agent models
pull`); on lite (and fake) it runs on the CPU with the weights its image carries.
(dict "ctx" $ "name" "asr" "v" .Values.asr "engineEnv" (list ...))
*/}}
{{- define "va.engine" -}}
{{- $ := .ctx -}}
{{- $v := .v -}}
{{- $name := .name -}}
{{- $upper := upper $name -}}
{{- $sel := dict "ctx" $ "component" $name -}}
{{- $models := $.Values.models -}}
{{- $gpu := include "va.gpu" $ -}}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ include "va.fullname" $ }}-{{ $name }}
  labels:
    {{- include "va.labels" $ | nindent 4 }}
    app.kubernetes.io/component: {{ $name }}
spec:
  replicas: {{ $v.replicas }}
  selector:
    matchLabels:
      {{- include "va.selector" $sel | nindent 6 }}
  # No spare GPU is assumed: replace pods one at a time without a surge.
  strategy:
    type: RollingUpdate
    rollingUpdate: {maxSurge: 0, maxUnavailable: 1}
  template:
    metadata:
      labels:
        {{- include "va.labels" $ | nindent 8 }}
        app.kubernetes.io/component: {{ $name }}
      {{- with (include "va.podAnnotations" (dict "ctx" $ "port" $v.port "own" $v.podAnnotations) | trim) }}
      annotations: {{- . | nindent 8 }}
      {{- end }}
    spec:
      {{- with $.Values.imagePullSecrets }}
      imagePullSecrets: {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext: {{- toYaml $.Values.podSecurityContext | nindent 8 }}
      # Open streams get D, then each job lane D (as the systemd units): 3 D + 15 s.
      terminationGracePeriodSeconds: {{ add (mul 3 $v.shutdownTimeoutS) 15 }}
      {{- if and $gpu $models.pull }}
      initContainers:
        - name: models-pull
          image: {{ include "va.image" (dict "ctx" $ "own" $v.image "component" $name) }}
          imagePullPolicy: {{ include "va.pullPolicy" (dict "ctx" $ "own" $v.image) }}
          # A no-op when the files are on the volume already.
          command: ["voice-agent", "models", "pull", {{ $v.pullName | quote }}, "--dir", {{ $models.mountPath | quote }}]
          env:
            - name: HF_HUB_OFFLINE
              value: "0"
            - name: HF_HOME  # the Hub client's cache, on the volume (the image may be read-only)
              value: {{ printf "%s/.hf-home" $models.mountPath }}
          securityContext: {{- toYaml $.Values.securityContext | nindent 12 }}
          volumeMounts:
            - {name: models, mountPath: {{ $models.mountPath }}}
      {{- end }}
      containers:
        - name: {{ $name }}
          image: {{ include "va.image" (dict "ctx" $ "own" $v.image "component" $name) }}
          imagePullPolicy: {{ include "va.pullPolicy" (dict "ctx" $ "own" $v.image) }}
          command: ["voice-agent", {{ $name | quote }}]
          securityContext: {{- toYaml $.Values.securityContext | nindent 12 }}
          ports:
            - {name: http, containerPort: {{ $v.port }}, protocol: TCP}
          env:
            {{- include "va.commonEnv" $ | nindent 12 }}
            - name: VA_{{ $upper }}__SERVER__HOST
              value: 0.0.0.0
            - name: VA_{{ $upper }}__SERVER__PORT
              value: {{ $v.port | quote }}
            - name: VA_{{ $upper }}__SERVER__DRAIN_TIMEOUT_S
              value: {{ $v.shutdownTimeoutS | quote }}
            {{- if $gpu }}
            {{- toYaml .engineEnv | nindent 12 }}
            {{- end }}
          startupProbe:
            httpGet: {path: /health, port: http}
            periodSeconds: {{ $v.startupProbe.periodSeconds }}
            failureThreshold: {{ $v.startupProbe.failureThreshold }}
          readinessProbe:
            httpGet: {path: /ready, port: http}
            periodSeconds: 5
            timeoutSeconds: 3
            failureThreshold: 2
          livenessProbe:
            httpGet: {path: /health, port: http}
            periodSeconds: 20
            timeoutSeconds: 5
            failureThreshold: 3
          resources:
            requests:
              {{- toYaml $v.resources.requests | nindent 14 }}
              {{- if $gpu }}
              {{ $.Values.gpu.resourceName }}: 1
              {{- end }}
            limits:
              {{- with $v.resources.limits }}
              {{- toYaml . | nindent 14 }}
              {{- end }}
              {{- if $gpu }}
              {{ $.Values.gpu.resourceName }}: 1
              {{- end }}
          {{- if $gpu }}
          volumeMounts:
            - {name: models, mountPath: {{ $models.mountPath }}}
          {{- end }}
      {{- if $gpu }}
      volumes:
        - name: models
          {{- if $models.persistence.enabled }}
          persistentVolumeClaim:
            claimName: {{ $models.persistence.existingClaim | default (printf "%s-models" (include "va.fullname" $)) }}
          {{- else }}
          emptyDir: {}
          {{- end }}
      nodeSelector:
        {{- toYaml (merge (deepCopy ($v.nodeSelector | default dict)) $.Values.gpu.nodeSelector) | nindent 8 }}
      tolerations:
        {{- toYaml (concat $.Values.gpu.tolerations ($v.tolerations | default list)) | nindent 8 }}
      {{- else }}
      {{- with $v.nodeSelector }}
      nodeSelector: {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.tolerations }}
      tolerations: {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- end }}
      {{- with $v.affinity }}
      affinity: {{- toYaml . | nindent 8 }}
      {{- end }}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ include "va.fullname" $ }}-{{ $name }}
  labels:
    {{- include "va.labels" $ | nindent 4 }}
    app.kubernetes.io/component: {{ $name }}
spec:
  type: ClusterIP
  selector:
    {{- include "va.selector" $sel | nindent 4 }}
  ports:
    - {name: http, port: {{ $.Values.service.port }}, targetPort: http, protocol: TCP}
{{- end -}}
