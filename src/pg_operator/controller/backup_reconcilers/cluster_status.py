"""The backup side's writes to a PostgresCluster: its backup conditions and `status.backup`, and its
finalizers; each conditional on the resourceVersion the reconcile read (the cluster's own reconcile writes
the same objects)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lightkube.core.exceptions import ApiError

from pg_operator import objects
from pg_operator.backup.scheduling import rfc3339
from pg_operator.controller.backup_reconcilers.shared import LostRace
from pg_operator.controller.kube_api import Api, PostgresClusterResource, is_conflict, is_not_found
from pg_operator.controller.writes import canonical
from pg_operator.specs.backup_status import BACKUP_CONDITION_TYPES, BACKUP_STATUS_KEY

# A backup condition as this side sets it: (status, reason, message); None: removed.
Ours = dict[str, tuple[str, str, str] | None]


def merged_conditions(
    previous: Mapping[str, Any] | None,
    ours: Ours,
    *,
    generation: int,
    stamp: str,
) -> list[dict[str, Any]]:
    """The cluster's conditions with ours set (None: removed); others untouched, transition times kept
    while a condition's status holds."""
    old = [dict(c) for c in (previous or {}).get("conditions") or ()]
    by_type = {str(c.get("type")): c for c in old}
    out = [c for c in old if c.get("type") not in BACKUP_CONDITION_TYPES]
    for type_ in BACKUP_CONDITION_TYPES:
        if type_ not in ours:  # not this reconcile's business: kept as it is
            if type_ in by_type:
                out.append(by_type[type_])
            continue
        value = ours[type_]
        if value is None:  # no longer applies
            continue
        status, reason, message = value
        before = by_type.get(type_)
        since = stamp
        if before and before.get("status") == status and before.get("lastTransitionTime"):
            since = str(before["lastTransitionTime"])
        out.append({"type": type_, "status": status, "reason": reason, "message": message[:32768],
                    "observedGeneration": generation, "lastTransitionTime": since})  # fmt: skip
    return out


class ClusterWrites:
    def __init__(self, api: Api, clock: Callable[[], Any]) -> None:
        self.api = api
        self.clock = clock

    async def status(self, body: Mapping[str, Any], ours: Ours, summary: dict[str, Any] | None) -> None:
        previous = objects.status(body)
        conditions = merged_conditions(
            previous, ours, generation=objects.generation(body), stamp=rfc3339(self.clock())
        )
        patch_status: dict[str, Any] = {}
        if canonical(conditions) != canonical(previous.get("conditions") or []):
            patch_status["conditions"] = conditions
        if canonical(summary) != canonical(previous.get(BACKUP_STATUS_KEY)):
            # A merge patch merges maps: null first the keys that went away.
            patch_status[BACKUP_STATUS_KEY] = summary
        if not patch_status:
            return
        # The resourceVersion makes the write conditional: the cluster's own reconcile may have just
        # written conditions this copy does not show; then this reconcile is retried on the fresh object.
        patch = {"metadata": {"resourceVersion": objects.resource_version(body)}, "status": patch_status}
        await self._patch(body, patch, subresource_status=True, what="its backup status was written")

    async def cleanup_condition(self, body: Mapping[str, Any], value: tuple[str, str, str]) -> None:
        await self.status(body, {"BackupStoreCleanup": value}, objects.status(body).get(BACKUP_STATUS_KEY))

    async def finalizers(self, body: Mapping[str, Any], finalizers: list[str]) -> None:
        patch = {"metadata": {"finalizers": finalizers, "resourceVersion": objects.resource_version(body)}}
        await self._patch(body, patch, subresource_status=False, what="its finalizers were written")

    async def _patch(
        self, body: Mapping[str, Any], patch: Mapping[str, Any], *, subresource_status: bool, what: str
    ) -> None:
        try:
            await self.api.merge_patch(
                PostgresClusterResource,
                objects.name(body),
                objects.namespace(body),
                patch,
                subresource_status=subresource_status,
            )
        except ApiError as exc:
            if is_not_found(exc):
                return
            if is_conflict(exc):
                raise LostRace(f"the cluster changed while {what}") from None
            raise
