{{/* The labels every object of Metis carries, as in manifests/: its component's name (omitted
when empty) and part-of. No Helm labels: the default render equals `kubectl kustomize
manifests/` (tests/repository/test_chart.py); Helm tracks its objects by its own annotations. */}}
{{- define "metis.labels" -}}
{{- if . }}
app.kubernetes.io/name: {{ . }}
{{- end }}
app.kubernetes.io/part-of: metis
{{- end }}

{{- define "metis.operatorImage" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "metis.indexerImage" -}}
{{ .Values.indexerImage.repository }}:{{ .Values.indexerImage.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "metis.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The pod and container security settings of the operator and the console (the restricted
Pod Security Standard). */}}
{{- define "metis.podSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 10001
  runAsGroup: 10001
  seccompProfile:
    type: RuntimeDefault
{{- end }}

{{- define "metis.containerSecurityContext" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  runAsNonRoot: true
  seccompProfile:
    type: RuntimeDefault
  capabilities:
    drop: [ALL]
{{- end }}

{{/* The operator's rules over the bases of the namespaces it serves (manifests/rbac.yaml):
the ClusterRole's, or the Role's of singleNamespace, which lacks the two cluster-scoped
ones. Secrets are read by name, never listed or watched. */}}
{{- define "metis.operatorRules" -}}
# The bases: watch them, keep kopf's annotations and finalizer, write their status.
- apiGroups: [metis.astraeus.io]
  resources: [knowledgebases]
  verbs: [get, list, watch, patch]
- apiGroups: [metis.astraeus.io]
  resources: [knowledgebases/status]
  verbs: [get, patch]
# Owner references with blockOwnerDeletion need update on the owner's finalizers.
- apiGroups: [metis.astraeus.io]
  resources: [knowledgebases/finalizers]
  verbs: [update]
# Backups: follow them (kopf's annotations and finalizer), write their status; a schedule
# creates its backups and deletes the oldest.
- apiGroups: [metis.astraeus.io]
  resources: [knowledgebasebackups]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [metis.astraeus.io]
  resources: [knowledgebasebackupschedules]
  verbs: [get, list, watch, patch]
- apiGroups: [metis.astraeus.io]
  resources: [knowledgebasebackups/status, knowledgebasebackupschedules/status]
  verbs: [get, patch]
# The children (server-side apply creates through patch; the index drive and the token are
# created once), watched so that a change or a deletion is seen at once.
- apiGroups: [""]
  resources: [configmaps, services]
  verbs: [get, list, watch, create, patch]
# patch: an index drive grows with the base's memory (metis_operator/index_drive.py).
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get, list, watch, create, patch, delete]
# patch: the copy of the image pull secrets in a base's namespace (METIS_INDEXER_IMAGE_PULL_SECRETS).
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create, patch]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
# With two replicas or more, one may be down at a time (a drain, an eviction).
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, list, watch, create, patch, update]
# Flux's source objects a base reads (spec.sources[].flux): their artifacts' revisions.
- apiGroups: [source.toolkit.fluxcd.io]
  resources: [gitrepositories, buckets, ocirepositories]
  verbs: [get, list, watch]
# What it observes: the indexer pods, and the workloads behind model Services.
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [list, watch]
# Events on the bases, through either Events API.
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end }}
