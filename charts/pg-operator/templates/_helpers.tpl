{{/*
The name of every object: fullnameOverride, else the release name when it holds the chart's name,
else "<release>-pg-operator". Kubernetes names stop at 63 characters.
*/}}
{{- define "pg-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/*
Labels of every object. app.kubernetes.io/name stays "pg-operator": each cluster's NetworkPolicy
admits the operator's pods by it (src/pg_operator/specs/network_policy.py).
*/}}
{{- define "pg-operator.labels" -}}
app.kubernetes.io/name: pg-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/*
The operator pods' selector: the labels of deploy/operator/deployment.yaml, which the clusters'
NetworkPolicies name (OPERATOR_POD_LABELS in src/pg_operator/specs/network_policy.py).
*/}}
{{- define "pg-operator.selectorLabels" -}}
app.kubernetes.io/name: pg-operator
app.kubernetes.io/component: operator
{{- end -}}

{{/*
The operator's ServiceAccount: the chart's own (serviceAccount.create, named serviceAccount.name or the
full name), or an existing one, which must then be named.
*/}}
{{- define "pg-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "pg-operator.fullname" .) -}}
{{- else -}}
{{- required "serviceAccount.name: the name of an existing ServiceAccount is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The user name the API server gives the operator's ServiceAccount (what the admission policies match). */}}
{{- define "pg-operator.serviceAccountUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "pg-operator.serviceAccountName" .) -}}
{{- end -}}

{{/* The names of imagePullSecrets, comma-separated (the operator's --image-pull-secrets). */}}
{{- define "pg-operator.pullSecretNames" -}}
{{- $names := list -}}
{{- range .Values.imagePullSecrets -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- join "," $names -}}
{{- end -}}

{{/* The namespaced install: a list of watched namespaces was given. */}}
{{- define "pg-operator.namespaced" -}}
{{- if .Values.watchNamespaces -}}true{{- end -}}
{{- end -}}

{{/* The operator image with its tag (the chart's appVersion unless image.tag is set). */}}
{{- define "pg-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/*
What the operator may do where it acts: in every namespace (the ClusterRole) or in each watched one
(a Role). The storageclasses, nodes and persistentvolumes rules are cluster-scoped, so only the
ClusterRole has them; the namespaced operator skips the StorageClass check, the node-loss handling and
node drains (docs/install.md). The rules, in the order of
deploy/operator/rbac.yaml, where each verb is explained.
*/}}
{{- define "pg-operator.rules" -}}
- apiGroups: [db.example.com]
  resources: [postgresclusters]
  verbs: [list, watch, patch]
- apiGroups: [db.example.com]
  resources: [postgresclusters/status]
  verbs: [patch]
- apiGroups: [db.example.com]
  resources: [postgresclusters/finalizers]
  verbs: [update]
- apiGroups: [db.example.com]
  resources: [backups]
  verbs: [list, watch, create, delete]
- apiGroups: [db.example.com]
  resources: [scheduledbackups]
  verbs: [list, watch]
- apiGroups: [db.example.com]
  resources: [backups/status, scheduledbackups/status]
  verbs: [patch]
- apiGroups: [""]
  resources: [pods/exec]
  verbs: [get, create]
- apiGroups: [""]
  resources: [pods/ephemeralcontainers]
  verbs: [patch]
- apiGroups: [""]
  resources: [serviceaccounts, services]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [pods]
  verbs: [get, list, watch, patch, delete]
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [list, watch, patch, delete]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
- apiGroups: [apps]
  resources: [statefulsets, deployments]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [list, watch, create, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [list, watch, create, patch, delete]
{{- if not (include "pg-operator.namespaced" .) }}
- apiGroups: [storage.k8s.io]
  resources: [storageclasses]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [nodes]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [persistentvolumes]
  verbs: [get]
{{- end }}
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
{{- end -}}
