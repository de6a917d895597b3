"""The object-store finalizer of a cluster whose `spec.backup.onDelete` is "delete" (pure decisions).

While such a cluster exists it carries FINALIZER. When it is deleted, the operator first removes its
StatefulSet and waits for the pods to stop (a primary archives its last segments while it shuts down,
which would otherwise land after the deletion), then deletes every object under `<path>/<cluster>/`, and
only then releases the finalizer. A store that cannot be reached is retried with backoff and reported;
an administrator can give up on it with RELEASE_ANNOTATION, which releases the finalizer and leaves the
store as it is. With "keep" (the default) there is no finalizer and the store is never touched.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pg_operator import objects
from pg_operator.api.constants import GROUP

FINALIZER = f"{GROUP}/backup-store"
# `kubectl annotate pgc NAME db.example.com/release-backup-store=true`: release without deleting.
RELEASE_ANNOTATION = f"{GROUP}/release-backup-store"
# Pods that are still there this long after the deletion started do not hold the deletion up any more
# (a node that is gone never confirms): the store is deleted anyway.
POD_GRACE = dt.timedelta(minutes=3)

Action = Literal["none", "add", "remove", "release-by-hand", "stop-pods", "wait-pods", "delete-store"]


@dataclass(frozen=True)
class FinalizerDecision:
    action: Action
    why: str = ""


def _on_delete(cluster: Mapping[str, Any]) -> str:
    backup = objects.spec(cluster).get("backup") or {}
    return str(backup.get("onDelete") or "keep") if backup else "keep"


def decide_finalizer(
    cluster: Mapping[str, Any],
    *,
    statefulset_exists: bool,
    pods_left: int,
    now: dt.datetime,
) -> FinalizerDecision:
    meta = objects.meta(cluster)
    has = FINALIZER in (meta.get("finalizers") or ())
    deleting = meta.get("deletionTimestamp")
    wants = _on_delete(cluster) == "delete"
    if not deleting:
        if wants and not has:
            return FinalizerDecision("add", "spec.backup.onDelete is delete")
        if has and not wants:
            return FinalizerDecision("remove", "spec.backup.onDelete is no longer delete")
        return FinalizerDecision("none")
    if not has:
        return FinalizerDecision("none")
    if objects.annotation(cluster, RELEASE_ANNOTATION).lower() == "true":
        return FinalizerDecision("release-by-hand", f"{RELEASE_ANNOTATION}=true: the store is left as it is")
    if not wants:
        return FinalizerDecision("remove", "spec.backup.onDelete is keep")
    if statefulset_exists:
        return FinalizerDecision("stop-pods", "stopping the instances before deleting the store")
    started = dt.datetime.fromisoformat(str(deleting).replace("Z", "+00:00"))
    if pods_left and now - started < POD_GRACE:
        return FinalizerDecision("wait-pods", f"{pods_left} instance pod(s) still stopping")
    return FinalizerDecision("delete-store", "deleting the cluster's objects in the store")


def finalizers_without(meta: Mapping[str, Any]) -> list[str]:
    return [f for f in meta.get("finalizers") or () if f != FINALIZER]


def finalizers_with(meta: Mapping[str, Any]) -> list[str]:
    return [*finalizers_without(meta), FINALIZER]
