"""The object-store finalizer's steps (decided by backup.store_cleanup.decide_finalizer): add it, stop a
deleted cluster's instances, empty its prefix in the store from this process — only when the prefix's
ownership marker names this cluster (backup.store_ownership.decide_deletion; otherwise the prefix is left
as it is, reported) — and release it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from lightkube.core.exceptions import ApiError

from pg_operator import objects
from pg_operator.backup.barman import ObjectStore
from pg_operator.backup.failures import classify
from pg_operator.backup.store_cleanup import finalizers_with, finalizers_without
from pg_operator.controller.backoff import Backoff
from pg_operator.controller.backup_reconcilers.cluster_status import ClusterWrites
from pg_operator.controller.backup_reconcilers.ownership import StoreOwnership
from pg_operator.controller.backup_reconcilers.shared import Notices, backup_config, stores_of
from pg_operator.controller.keys import ClusterKey
from pg_operator.controller.kube_api import Api, is_not_found
from pg_operator.controller.store_calls import BUSY_RETRY_SECONDS
from pg_operator.controller.store_client import (
    StoreBusy,
    StoreError,
    delete_prefix,
    store_access,
)

log = logging.getLogger(__name__)


class StoreFinalizer:
    def __init__(
        self, api: Api, writes: ClusterWrites, notices: Notices, backoff: Backoff, ownership: StoreOwnership
    ) -> None:
        self.api = api
        self.ownership = ownership
        self.writes = writes
        self.notices = notices
        self.backoff = backoff

    async def step(self, key: ClusterKey, body: Mapping[str, Any], action: str, why: str) -> float | None:
        """One step; seconds until the next reconcile, or None."""
        namespace, name = key
        meta = objects.meta(body)
        if action == "add":
            await self.writes.finalizers(body, finalizers_with(meta))
            return 1.0
        if action in ("remove", "release-by-hand"):
            await self.writes.finalizers(body, finalizers_without(meta))
            if action == "release-by-hand":
                await self.notices.post(
                    body, "Warning", "BackupStoreReleased", f"finalizer released by hand: {why}"
                )
            return None if objects.deleting(body) else 1.0
        if action == "stop-pods":
            log.info(
                "cluster %s/%s deleted with onDelete=delete: stopping its instances first", namespace, name
            )
            try:
                await self.api.delete("apps/v1", "StatefulSet", name, namespace)
            except ApiError as exc:
                if not is_not_found(exc):
                    raise
            await self.writes.cleanup_condition(body, ("False", "StoppingInstances", why))
            return 2.0
        if action == "wait-pods":
            await self.writes.cleanup_condition(body, ("False", "StoppingInstances", why))
            return 3.0
        return await self._delete_store(key, body)

    async def _delete_store(self, key: ClusterKey, body: Mapping[str, Any]) -> float | None:
        """Every generation's prefix (backup.generations), each only when its marker names the cluster."""
        namespace, name = key
        config = backup_config(body)
        assert config is not None
        for store in stores_of(body, config):
            try:
                deletion = await self.ownership.deletion(body, config, store)
                if deletion.kind == "leave":
                    # Not ours: nothing is deleted, and the cluster is not held back for it.
                    await self.notices.post(body, "Warning", deletion.reason, deletion.message)
                    continue
                deleted = 0
                if deletion.kind == "delete":
                    access = await store_access(self.api, namespace, config, store, cluster=name)
                    result = await delete_prefix(access)
                    deleted = result.count
                    if not result.complete:  # stopped at the page limit: the next reconcile goes on
                        log.info("cluster %s/%s: deleted %d object(s) under %s, more left",
                                 namespace, name, deleted, store.prefix)  # fmt: skip
                        return 1.0
            except StoreBusy:
                return BUSY_RETRY_SECONDS
            except StoreError as exc:
                text = str(exc)
                if not text.startswith("NoSuchBucket"):
                    return await self._store_failed(key, body, store, text)
                deleted = 0
                log.info(
                    "cluster %s/%s: bucket %s does not exist; nothing to delete",
                    namespace, name, store.bucket,
                )  # fmt: skip
            where = f"{store.destination_url}/{store.prefix}"
            await self.notices.post(
                body, "Normal", "BackupStoreDeleted", f"deleted {deleted} object(s) under {where}"
            )
        await self.writes.finalizers(body, finalizers_without(objects.meta(body)))
        return None

    async def _store_failed(
        self, key: ClusterKey, body: Mapping[str, Any], store: ObjectStore, text: str
    ) -> float:
        failure = classify(1, text, secrets=())
        # The first step of the backoff every time, as before the reconcilers were split: the reconcile
        # itself succeeds (it reports and asks to come back), so no run of failures builds up.
        delay = self.backoff.delay(1)
        message = (
            f"cannot delete the cluster's objects under {store.destination_url}/{store.prefix}: "
            f"{failure.message}; retrying in {delay:.0f} s. To give up and keep them, annotate the "
            "cluster with db.example.com/release-backup-store=true"
        )
        await self.writes.cleanup_condition(body, ("False", failure.reason, message))
        await self.notices.once(key, body, "Warning", f"BackupStoreCleanup{failure.reason}", message)
        return delay
