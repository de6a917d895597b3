"""Stand-ins for what a sub-reconciler talks to, for its unit tests (no cluster): the API (records every
write), the Event recorder, the pod exec (answers per command word), and a context for one pass over a
cluster whose children are plain dicts as the watch cache holds them."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from harness.objects import cluster_model
from pg_operator.api.cluster import PostgresCluster
from pg_operator.controller.cache import Snapshot
from pg_operator.controller.pod_exec import ExecError, ExecResult
from pg_operator.controller.reconcilers import ReconcileContext

NAMESPACE, NAME, UID = "shop", "orders-db", "uid-1"


class FakeApi:
    """Records the writes; answers a create with the object, a lookup with nothing."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.patched: list[tuple[str, dict[str, Any]]] = []
        self.applied: list[dict[str, Any]] = []
        self.deleted: list[tuple[str, str]] = []
        self.refuse_patch: Exception | None = None

    async def create_dict(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self.created.append(dict(body))
        return dict(body)

    async def create(self, obj: Any) -> Any:  # Events
        return obj

    async def merge_patch(self, res: Any, name: str, namespace: str, patch: dict[str, Any], **_: Any) -> None:
        if self.refuse_patch is not None:
            raise self.refuse_patch
        self.patched.append((name, patch))

    async def apply(self, body: Mapping[str, Any], **_: Any) -> None:
        self.applied.append(dict(body))

    async def delete(self, api_version: str, kind: str, name: str, namespace: str | None, **_: Any) -> None:
        self.deleted.append((kind, name))

    async def find_metadata(self, *_: Any) -> None:
        return None


class RecordedEvents:
    def __init__(self) -> None:
        self.posted: list[tuple[str, str, str]] = []

    async def record(self, _cluster: Any, event_type: str, reason: str, message: str) -> bool:
        self.posted.append((event_type, reason, message))
        return True

    def reasons(self) -> list[str]:
        return [reason for _, reason, _ in self.posted]


class FakeExec:
    """Runs nothing: records (pod, argv, stdin) and answers with `answer(argv, stdin)`."""

    def __init__(self, answer: Callable[[list[str], bytes], ExecResult | ExecError] | None = None) -> None:
        self.calls: list[tuple[str, list[str], bytes]] = []
        self.answer = answer or (lambda argv, stdin: ExecResult(0, "", ""))

    async def run(
        self, namespace: str, pod: str, argv: list[str], *, stdin: bytes = b"", **_: Any
    ) -> ExecResult:
        self.calls.append((pod, list(argv), stdin))
        result = self.answer(argv, stdin)
        if isinstance(result, ExecError):
            raise result
        return result


def owned(kind: str, name: str, api_version: str = "v1", **fields: Any) -> dict[str, Any]:
    """A child as the cache holds it: the cluster's label and controller reference, a uid and a version."""
    ref = {"apiVersion": "db.example.com/v1alpha1", "kind": "PostgresCluster", "name": NAME, "uid": UID,
           "controller": True}  # fmt: skip
    meta = {"name": name, "namespace": NAMESPACE, "uid": f"uid-{name}", "resourceVersion": "7",
            "labels": {"db.example.com/cluster": NAME}, "ownerReferences": [ref]}  # fmt: skip
    meta.update(fields.pop("metadata", {}))
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, **fields}


def instance_pod(name: str, role: str = "replica", *, down: bool = False) -> dict[str, Any]:
    """An instance as Patroni labels and annotates it; `down`: the kubelet reports its database container
    terminated (ready or not)."""
    state = {"terminated": {"exitCode": 137}} if down else {"running": {}}
    return owned(
        "Pod",
        name,
        metadata={"labels": {"db.example.com/cluster": NAME, "role": role},
                  "annotations": {"status": json.dumps({"role": role, "state": "running"})}},
        spec={"containers": [{"name": "postgres", "image": "localhost/pg-operator/postgres:16.13"}]},
        status={"podIP": f"10.0.0.{len(name)}", "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "postgres", "state": state, "restartCount": 0}]},
    )  # fmt: skip


def primary_pod(name: str = f"{NAME}-0") -> dict[str, Any]:
    """A running primary, ready."""
    return instance_pod(name, "primary")


def context(
    children: list[dict[str, Any]] | None = None,
    cluster: PostgresCluster | None = None,
    statefulset: Mapping[str, Any] | None = None,
    annotations: Mapping[str, str] | None = None,
    **snapshot: Any,
) -> ReconcileContext:
    """One pass over the cluster (cluster_model's orders-db in shop unless given) with these children."""
    model = cluster or cluster_model(uid=UID)
    body = {"apiVersion": "db.example.com/v1alpha1", "kind": "PostgresCluster",
            "metadata": {"name": model.name, "namespace": model.namespace, "uid": model.uid,
                         "resourceVersion": "3", "generation": 1, "annotations": dict(annotations or {})},
            "spec": {}}  # fmt: skip
    by_kind: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for child in children or []:
        by_kind.setdefault((child["apiVersion"], child["kind"]), []).append(child)
    return ReconcileContext(body, model, Snapshot(body, by_kind, **snapshot), statefulset)
