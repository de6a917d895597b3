"""Builders of the objects tests send: one PostgresCluster builder (a dict, or the parsed model the pure
builders take), StorageClasses, the S3 credentials Secret, Backups and ScheduledBackups."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from pg_operator.api.cluster import PostgresCluster

API_VERSION = "db.example.com/v1alpha1"
CLUSTER_LABEL = "db.example.com/cluster"


def cluster(
    name: str = "orders-db",
    namespace: str = "shop",
    *,
    replicas: int = 3,
    version: str = "16",
    storage: str = "1Gi",
    metadata: Mapping[str, Any] | None = None,
    typed: bool = True,
    **spec: Any,
) -> dict[str, Any]:
    """A PostgresCluster as a dict: metadata = name, namespace, then `metadata`; spec = replicas, version,
    storage, then the other keyword arguments (later keys win, as in a merge). With typed=False the
    apiVersion and kind are left out, as a body read by the pure builders may lack them."""
    obj: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "PostgresCluster"} if typed else {}
    obj["metadata"] = {"name": name, "namespace": namespace, **(metadata or {})}
    obj["spec"] = {"replicas": replicas, "version": version, "storage": storage, **spec}
    return obj


def cluster_model(
    name: str = "orders-db",
    namespace: str = "shop",
    *,
    replicas: int = 3,
    storage: str = "20Gi",
    uid: str = "uid-1",
    generation: int = 1,
    **spec: Any,
) -> PostgresCluster:
    """What the unit tests of the pure builders take: the cluster() body (without apiVersion/kind) with a
    uid and a generation, parsed; `spec` as in cluster()."""
    body = cluster(name, namespace, replicas=replicas, storage=storage, typed=False,
                   metadata={"uid": uid, "generation": generation}, **spec)  # fmt: skip
    return PostgresCluster.from_obj(body)


def storage_class(name: str, *, expandable: bool | None = None, reclaim: str | None = None) -> dict[str, Any]:
    """A StorageClass no provisioner serves (kwok has none; harness.pv_provisioner or pre-bound volumes
    stand in), binding at once."""
    body: dict[str, Any] = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": "kubernetes.io/no-provisioner",
        "volumeBindingMode": "Immediate",
    }
    if expandable is not None:
        body["allowVolumeExpansion"] = expandable
    if reclaim is not None:
        body["reclaimPolicy"] = reclaim
    return body


def s3_credentials_secret(
    name: str, namespace: str, access_key_id: str, secret_access_key: str, *, cluster: str | None = None
) -> dict[str, Any]:
    """The Secret a cluster's `backup.s3.credentials.secretName` names (keys of the backup contract),
    labelled for `cluster` (the operator uses backup credentials only from a Secret labelled for it)."""

    def b64(v: str) -> str:
        return base64.b64encode(v.encode()).decode()

    data = {"ACCESS_KEY_ID": b64(access_key_id), "ACCESS_SECRET_KEY": b64(secret_access_key)}
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if cluster is not None:
        meta["labels"] = {"db.example.com/cluster": cluster}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": data}


def backup(name: str, namespace: str, cluster_name: str) -> dict[str, Any]:
    """A Backup of one cluster, taken once."""
    return {"apiVersion": API_VERSION, "kind": "Backup", "metadata": {"name": name, "namespace": namespace},
            "spec": {"cluster": cluster_name}}  # fmt: skip


def scheduled_backup(
    name: str, namespace: str, cluster_name: str, schedule: str, **spec: Any
) -> dict[str, Any]:
    """A ScheduledBackup of one cluster (`spec`: immediate, suspend, ...)."""
    return {"apiVersion": API_VERSION, "kind": "ScheduledBackup",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"cluster": cluster_name, "schedule": schedule, **spec}}  # fmt: skip
