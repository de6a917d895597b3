"""The StatefulSet that runs the instances: one pod per instance, Patroni (via the image's entrypoint) in
each, a `data` volume per pod. The pod layout is the contract with the instance entrypoint
(docs/architecture.md)."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pg_operator.api.cluster import PostgresCluster
from pg_operator.api.constants import (
    CONFIG_MOUNT,
    CONTAINER_NAME,
    CUSTOM_QUERIES_FILE,
    CUSTOM_QUERIES_MOUNT,
    DATA_MOUNT,
    DATA_VOLUME,
    GROUP,
    METRICS_PORT,
    METRICS_PORT_NAME,
    PATRONI_PORT,
    PATRONI_PORT_NAME,
    PATRONI_TLS_ANNOTATION,
    PG_PORT,
    PG_PORT_NAME,
    PGDATA,
    POSTGRES_UID,
    SECRETS_MOUNT,
    TLS_MOUNT,
)
from pg_operator.images import default_image, image_pull_secrets
from pg_operator.orchestration.nodes import NodeView
from pg_operator.specs import names, placement
from pg_operator.specs.backup_pod import instance_backup_section, pod_env
from pg_operator.specs.labels import COMPONENT_INSTANCE, child_labels, child_metadata, selector_labels
from pg_operator.tls_files import TLS_FILES

# Fields the API server refuses to change after creation: taken from the live object when there is one.
IMMUTABLE_SPEC_FIELDS = ("selector", "serviceName", "volumeClaimTemplates", "podManagementPolicy")

# Patroni stops PostgreSQL with a fast shutdown (one checkpoint) and then releases the leader lock so a
# replica takes over at once. Killed before that, the data is still safe (crash recovery) but the primary
# role only moves after the lock's TTL. A minute covers the checkpoint at the sizes this operator targets.
TERMINATION_GRACE_SECONDS = 60

# initdb on a new volume, or a base backup of a large primary, may take long before Patroni's REST API
# reports the member alive; the startup probe allows an hour before liveness takes over. It probes every
# second: until it succeeds the kubelet runs no readiness probe, so a container restarted in place (a
# crashed primary that recovers, a replica rejoining) stayed out of its Services for up to a whole
# period after Patroni answered (10 s when the period was 10 s).
STARTUP_PERIOD_SECONDS = 1
STARTUP_FAILURE_THRESHOLD = 3600
# Readiness every 2 s: a promoted replica that failed /readiness while its primary was dead (it was not
# streaming) joins -rw within 2 s of answering as leader, instead of 5.
READINESS_PERIOD_SECONDS = 2

# Pod-template annotation: a digest of instance.yaml's backup section. The entrypoint renders
# archive_command once, at start, so a changed store must reach the pods through a rollout, which a
# template change gives (the ConfigMap alone does not restart anything).
BACKUP_CONFIG_ANNOTATION = f"{GROUP}/backup-config"

_SECRET_VOLUMES = (
    ("superuser", names.superuser_secret),
    ("replication", names.replication_secret),
    ("app", names.app_secret),
    ("patroni-api", names.patroni_api_secret),
)


def _env(cluster: PostgresCluster) -> list[dict[str, Any]]:
    def field(path: str) -> dict[str, Any]:
        return {"valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}

    return [
        {"name": "PGOP_CLUSTER_NAME", "value": cluster.name},
        {"name": "PGOP_NAMESPACE", **field("metadata.namespace")},
        {"name": "PGOP_POD_NAME", **field("metadata.name")},
        {"name": "PGOP_POD_IP", **field("status.podIP")},
        {"name": "PGOP_PG_MAJOR", "value": cluster.spec.version},
        {"name": "PGDATA", "value": PGDATA},
        # barman-cloud's credentials, by secretKeyRef only (none without backups or a restore).
        *pod_env(cluster.spec.backup, cluster.spec.bootstrap.recovery),
    ]


def _backup_digest(cluster: PostgresCluster) -> str | None:
    section = instance_backup_section(cluster.name, cluster.spec.backup, cluster.spec.bootstrap.recovery)
    if section is None:
        return None
    return hashlib.sha256(json.dumps(section, sort_keys=True).encode()).hexdigest()[:16]


def _resources(cluster: PostgresCluster) -> dict[str, Any]:
    res = cluster.spec.resources
    limits = {"memory": cluster.spec.memory_limit}
    if res.limits.cpu is not None:
        limits["cpu"] = res.limits.cpu
    return {"requests": {"cpu": res.requests.cpu, "memory": res.requests.memory}, "limits": limits}


def _probe(path: str, *, period: int, timeout: int, failures: int) -> dict[str, Any]:
    return {
        # The kubelet does not verify the certificate; it only needs Patroni's answer.
        "httpGet": {"path": path, "port": PATRONI_PORT_NAME, "scheme": "HTTPS"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
        "successThreshold": 1,
    }


def _container(cluster: PostgresCluster) -> dict[str, Any]:
    spec = cluster.spec
    mounts = [
        {"name": DATA_VOLUME, "mountPath": DATA_MOUNT},
        {"name": "config", "mountPath": CONFIG_MOUNT, "readOnly": True},
        *(
            {"name": f"secret-{kind}", "mountPath": f"{SECRETS_MOUNT}/{kind}", "readOnly": True}
            for kind, _ in _SECRET_VOLUMES
        ),
        {"name": "tls", "mountPath": TLS_MOUNT, "readOnly": True},
        {"name": "shm", "mountPath": "/dev/shm"},  # noqa: S108 - a pod-private memory volume
    ]
    if spec.monitoring.custom_queries is not None:
        mounts.append({"name": "custom-queries", "mountPath": CUSTOM_QUERIES_MOUNT, "readOnly": True})
    return {
        "name": CONTAINER_NAME,
        # No command: the image's entrypoint is the instance manager.
        "image": spec.image or default_image(spec.version),
        "imagePullPolicy": spec.image_pull_policy,
        "ports": [
            {"name": PG_PORT_NAME, "containerPort": PG_PORT, "protocol": "TCP"},
            {"name": PATRONI_PORT_NAME, "containerPort": PATRONI_PORT, "protocol": "TCP"},
            {"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT, "protocol": "TCP"},  # HTTPS /metrics
        ],
        "env": _env(cluster),
        "resources": _resources(cluster),
        "volumeMounts": mounts,
        "startupProbe": _probe(
            "/liveness", period=STARTUP_PERIOD_SECONDS, timeout=5, failures=STARTUP_FAILURE_THRESHOLD
        ),
        "livenessProbe": _probe("/liveness", period=10, timeout=5, failures=3),
        "readinessProbe": _probe("/readiness", period=READINESS_PERIOD_SECONDS, timeout=3, failures=3),
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": POSTGRES_UID,
            "runAsGroup": POSTGRES_UID,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def _custom_queries_volume(cluster: PostgresCluster) -> list[dict[str, Any]]:
    # Optional: a missing ConfigMap or key leaves /metrics with the built-in set, never a pod that cannot
    # start. Mounted as a directory (not subPath), so the kubelet updates the file in place.
    custom = cluster.spec.monitoring.custom_queries
    if custom is None:
        return []
    items = [{"key": custom.key, "path": CUSTOM_QUERIES_FILE}]
    source = {"name": custom.config_map_name, "items": items, "optional": True, "defaultMode": 0o444}
    return [{"name": "custom-queries", "configMap": source}]


def _volumes(cluster: PostgresCluster) -> list[dict[str, Any]]:
    secret_items = [{"key": "username", "path": "username"}, {"key": "password", "path": "password"}]
    return [
        {"name": "config", "configMap": {"name": names.instance(cluster), "defaultMode": 0o444}},
        *(
            # Readable by the postgres group (fsGroup) only; just the two keys the entrypoint needs.
            {
                "name": f"secret-{kind}",
                "secret": {"secretName": name_of(cluster), "items": secret_items, "defaultMode": 0o440},
            }
            for kind, name_of in _SECRET_VOLUMES
        ),
        # The server and replication certificates, their keys and the CA bundle (never the CA's key).
        {
            "name": "tls",
            "secret": {
                "secretName": names.server_tls_secret(cluster),
                "items": [{"key": k, "path": k} for k in TLS_FILES],
                "defaultMode": 0o440,
            },
        },
        # The container runtime's default 64Mi /dev/shm is too small for PostgreSQL's parallel queries.
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
        *_custom_queries_volume(cluster),
    ]


def _pod_template(cluster: PostgresCluster, anti: placement.AntiAffinity) -> dict[str, Any]:
    pod_spec: dict[str, Any] = {
        "serviceAccountName": names.instance(cluster),
        # Patroni talks to the API server (leader lock, pod labels).
        "automountServiceAccountToken": True,
        # Service environment variables are useless to PostgreSQL and grow with every Service in the
        # namespace.
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": POSTGRES_UID,
            "runAsGroup": POSTGRES_UID,
            "fsGroup": POSTGRES_UID,
            # Large data volumes: re-chown only when the volume's root does not match already.
            "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(cluster)],
        "volumes": _volumes(cluster),
    }
    spread = cluster.spec.affinity
    affinity = placement.pod_affinity(cluster, anti, selector_labels(cluster), spread.topology_key)
    if affinity is not None:
        pod_spec["affinity"] = affinity
    zones = placement.zone_spread(spread.zone_spread, spread.zone_topology_key, selector_labels(cluster))
    if zones:
        pod_spec["topologySpreadConstraints"] = zones
    if cluster.spec.node_selector:
        pod_spec["nodeSelector"] = dict(cluster.spec.node_selector)
    if cluster.spec.tolerations:
        pod_spec["tolerations"] = [
            t.model_dump(by_alias=True, exclude_none=True) for t in cluster.spec.tolerations
        ]
    if cluster.spec.priority_class_name is not None:
        pod_spec["priorityClassName"] = cluster.spec.priority_class_name
    # The install's --image-pull-secrets (images.py); the major upgrade's ephemeral container is pulled
    # with these too, as it runs in this pod.
    pull_secrets = image_pull_secrets()
    if pull_secrets:
        pod_spec["imagePullSecrets"] = pull_secrets
    annotations = {"kubectl.kubernetes.io/default-container": CONTAINER_NAME, PATRONI_TLS_ANNOTATION: "true"}
    digest = _backup_digest(cluster)
    if digest is not None:
        annotations[BACKUP_CONFIG_ANNOTATION] = digest
    return {
        "metadata": {"labels": child_labels(cluster, COMPONENT_INSTANCE), "annotations": annotations},
        "spec": pod_spec,
    }


def _volume_claim_template(cluster: PostgresCluster) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": cluster.spec.storage}},
    }
    if cluster.spec.storage_class_name is not None:
        spec["storageClassName"] = cluster.spec.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": DATA_VOLUME, "labels": child_labels(cluster, COMPONENT_INSTANCE)},
        "spec": spec,
    }


def statefulset(
    cluster: PostgresCluster,
    existing: Mapping[str, Any] | None = None,
    nodes: Sequence[NodeView] | None = None,
) -> dict[str, Any]:
    """The desired StatefulSet. With `existing` (the live object), its immutable fields are kept as they
    are, so applying the result never asks the API server for a forbidden change; storage growth goes to
    the PVCs directly (see pvc.py). `nodes`: the Nodes the operator sees (None: it may not read them),
    for the `auto` anti-affinity of a StatefulSet not created yet (specs/placement.py)."""
    spec: dict[str, Any] = {
        "replicas": cluster.spec.replicas,
        "serviceName": names.headless_service(cluster),
        "selector": {"matchLabels": selector_labels(cluster)},
        # Patroni members are peers: any pod may be primary, and ordinal order gives nothing. OrderedReady
        # would keep pod 2 from being created (or re-created) while pod 0 is down — exactly when a replica
        # is needed most — and would serialise the initial bootstrap.
        "podManagementPolicy": "Parallel",
        # The operator rolls pods itself (replicas first, then a switchover, then the old primary), so the
        # StatefulSet controller must never restart pods on its own.
        "updateStrategy": {"type": "OnDelete"},
        "template": _pod_template(cluster, placement.anti_affinity(cluster, existing, nodes)),
        "volumeClaimTemplates": [_volume_claim_template(cluster)],
        # Data outlives the cluster object and scale-downs; deleting volumes is left to a person.
        "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
        "revisionHistoryLimit": 10,
    }
    if existing is not None:
        live_spec = existing.get("spec") or {}
        for key in IMMUTABLE_SPEC_FIELDS:
            if key in live_spec:
                spec[key] = copy.deepcopy(live_spec[key])
        # The template must keep matching the live selector, whatever labels this version would choose.
        live_selector = (live_spec.get("selector") or {}).get("matchLabels") or {}
        spec["template"]["metadata"]["labels"].update(live_selector)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": child_metadata(cluster, names.statefulset(cluster), COMPONENT_INSTANCE),
        "spec": spec,
    }
