"""The storage sub-reconciler: a StorageClass that does not exist is reported (the StatefulSet waits for it),
and data volumes grow when spec.storage does (a refusal, e.g. a class without expansion, is reported).

StorageClasses are cluster-scoped: a namespaced install may not read them. The operator then asks the
API server once, at start, whether it may (`storage_classes_readable`), and without that permission it
neither lists nor watches them and skips the check (the cache's snapshot says the classes are unknown).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from lightkube.core.exceptions import ApiError
from lightkube.resources.authorization_v1 import SelfSubjectAccessReview

from pg_operator import objects
from pg_operator.controller.cache import Snapshot
from pg_operator.controller.cluster_memory import ClusterMemory
from pg_operator.controller.kube_api import Api, access_review, allowed, resource_for
from pg_operator.controller.reconcilers import Problem, ReconcileContext, SubReconciler
from pg_operator.controller.writes import WriteId, WriteMemo, canonical
from pg_operator.specs import pvc_resizes

log = logging.getLogger(__name__)

# What the cache does with StorageClasses: list and watch them (controller/informer.py).
STORAGE_CLASS_VERBS = ("list", "watch")
STORAGE_CLASSES_UNREADABLE = (
    "this operator may not list and watch StorageClasses (a namespaced install): spec.storageClassName "
    "is not checked; a cluster naming a class that does not exist waits with Pending volume claims"
)


def storage_class_review(verb: str) -> SelfSubjectAccessReview:
    """May this operator `verb` StorageClasses cluster-wide?"""
    return access_review("storage.k8s.io", "storageclasses", verb)


async def storage_classes_readable(api: Api) -> bool:
    """Whether the API server's authorizer lets this operator list and watch StorageClasses."""
    return await allowed(api, "storage.k8s.io", "storageclasses", STORAGE_CLASS_VERBS)


def storage_class_problem(spec: Mapping[str, Any], snapshot: Snapshot) -> Problem | None:
    name = spec.get("storageClassName")
    if name and snapshot.storage_classes_known and name not in snapshot.storage_classes:
        return (
            "StorageClassNotFound",
            f"spec.storageClassName names StorageClass {name!r}, which does not exist; "
            "the StatefulSet is created once it does",
        )
    return None


class StorageReconciler(SubReconciler):
    def __init__(self, api: Api, memo: WriteMemo) -> None:
        self.api = api
        self.memo = memo
        # A refused PVC growth, by claim: (its resourceVersion, the patch, the problem). While the memo
        # holds the patch back, the reconciles in between keep reporting it instead of flapping to Healthy.
        self._resize_refused: ClusterMemory[dict[WriteId, tuple[str | None, str, Problem]]] = ClusterMemory(
            dict
        )

    async def act(self, ctx: ReconcileContext) -> None:
        ctx.report(storage_class_problem(objects.spec(ctx.body), ctx.snapshot))

    async def follow_up(self, ctx: ReconcileContext) -> int:
        writes = 0
        refusals = self._resize_refused.of(ctx.key)
        for pvc_name, patch in pvc_resizes(ctx.cluster, ctx.snapshot.of_kind("v1", "PersistentVolumeClaim")):
            ident = (ctx.namespace, "PersistentVolumeClaim", pvc_name, "resize")
            rv = objects.resource_version(ctx.snapshot.find("v1", "PersistentVolumeClaim", pvc_name))
            fingerprint = canonical(patch)
            if self.memo.pending(ident, rv, fingerprint):
                refused = refusals.get(ident)
                if refused is not None and refused[:2] == (rv, fingerprint):
                    ctx.report(refused[2])
                continue
            refusals.pop(ident, None)
            log.info("growing PVC %s/%s", ctx.namespace, pvc_name)
            writes += 1
            try:
                await self.api.merge_patch(
                    resource_for("v1", "PersistentVolumeClaim"), pvc_name, ctx.namespace, patch
                )
            except ApiError as exc:
                if exc.status.code not in (403, 422):
                    raise
                # e.g. the StorageClass does not allow expansion: retrying soon will not help; report it
                refusal = (
                    "StorageResizeRefused",
                    f"PersistentVolumeClaim {pvc_name} cannot grow to spec.storage: {exc.status.message}",
                )
                refusals[ident] = (rv, fingerprint, refusal)
                ctx.report(refusal)
            self.memo.wrote(ident, rv, fingerprint)
        return writes
