"""A PostgresCluster's status on the kwok profile, where no Patroni runs: the role labels Patroni would
set, and waiting for the operator's Ready."""

from __future__ import annotations

from typing import Any

from harness.kube import KubectlLike, condition, get_json
from harness.objects import CLUSTER_LABEL
from harness.waiting import wait_until


def label_roles(kube: KubectlLike, namespace: str, cluster: str) -> None:
    """Do what Patroni does in real pods (no process runs on kwok): role=primary on the first instance,
    role=replica on the others."""
    pods = get_json(kube, "pods", "-n", namespace, "-l", f"{CLUSTER_LABEL}={cluster}")["items"]
    for pod in pods:
        name = pod["metadata"]["name"]
        role = "primary" if name == f"{cluster}-0" else "replica"
        if (pod["metadata"].get("labels") or {}).get("role") != role:
            kube.kubectl("label", "pod", name, "-n", namespace, f"role={role}", "--overwrite")


def cluster_obj(kube: KubectlLike, ns: str, name: str) -> Any:
    """The PostgresCluster as the API server has it (kubectl fails if it does not exist)."""
    return get_json(kube, "postgresclusters.db.example.com", name, "-n", ns)


def wait_ready(kube: KubectlLike, ns: str, name: str, replicas: int, timeout: float = 120) -> dict[str, Any]:
    """Label the roles as Patroni would until the cluster is Ready with `replicas` ready instances."""

    def ready() -> Any:
        label_roles(kube, ns, name)  # what Patroni does in real pods
        obj = cluster_obj(kube, ns, name)
        status = obj.get("status") or {}
        if condition(obj, "Ready").get("status") == "True" and status.get("readyReplicas") == replicas:
            return obj
        return None

    return dict(wait_until(f"{ns}/{name} Ready with {replicas} instances", ready, timeout))
