"""What the backup reconcilers share: Events (and Events once per reason), reading a cluster's
`spec.backup`, comparing statuses, keeping the cache abreast of their own writes, and the psql command
line they run in the pods."""

from __future__ import annotations

import logging
from collections.abc import Hashable, Mapping
from typing import Any

from pg_operator import objects
from pg_operator.api.backup import BackupConfiguration
from pg_operator.backup import generations
from pg_operator.backup.barman import ObjectStore
from pg_operator.backup.from_spec import archive_settings
from pg_operator.controller import pod_exec
from pg_operator.controller.cache import Cache
from pg_operator.controller.events import EventRecorder
from pg_operator.controller.loop import Result

log = logging.getLogger(__name__)

# The psql command line in the instance's container (one definition, beside the exec that runs it).
SOCKET_DIR, PSQL = pod_exec.SOCKET_DIR, pod_exec.PSQL


def again(seconds: float | None) -> Result:
    """A reconcile's outcome: come back after `seconds`, or (None) only when woken."""
    return Result(requeue_after=seconds)


def backup_config(cluster: Mapping[str, Any] | None) -> BackupConfiguration | None:
    raw = objects.spec(cluster).get("backup")
    if not raw:
        return None
    return BackupConfiguration.model_validate(raw)


def store_of(cluster: Mapping[str, Any], config: BackupConfiguration) -> ObjectStore:
    """The cluster's current place in its store: its newest backup generation's (backup.generations)."""
    return archive_settings(config, generations.current_server(cluster)).store


def stores_of(cluster: Mapping[str, Any], config: BackupConfiguration) -> list[ObjectStore]:
    """Every generation's place, oldest first (the onDelete: delete cleanup empties each)."""
    gens = generations.of_cluster(cluster)
    names = [g.server_name for g in gens] or [objects.name(cluster)]
    return [archive_settings(config, n).store for n in names]


def wrote(cache: Cache, body: Mapping[str, Any], event_type: str = "MODIFIED") -> None:
    """Put what this process just wrote (a status, a deletion) into the watch cache at once: a reconcile
    right after (the cluster's, woken by this one) must not read the object as it was. The watch
    brings the same a moment later."""
    cache.observe(body, event_type)


class LostRace(Exception):
    """A conditional write lost a race; the reconcile is retried shortly on the fresh object."""


class Notices:
    """Events on our objects; `once` posts one per (key, type) until the reason changes, so a failing
    store retried every minute does not flood the namespace."""

    def __init__(self, recorder: EventRecorder) -> None:
        self.recorder = recorder
        self._sent: dict[tuple[Hashable, str], str] = {}

    async def post(self, obj: Mapping[str, Any], event_type: str, reason: str, message: str) -> None:
        await self.recorder.record(dict(obj), event_type, reason, message)  # never raises

    async def once(
        self, key: Hashable, obj: Mapping[str, Any], event_type: str, reason: str, message: str
    ) -> None:
        slot = (key, event_type)
        if self._sent.get(slot) == reason:
            return
        self._sent[slot] = reason
        await self.post(obj, event_type, reason, message)

    def sent(self, key: Hashable, event_type: str) -> bool:
        return bool(self._sent.get((key, event_type)))

    def reset(self, key: Hashable, event_type: str) -> None:
        self._sent.pop((key, event_type), None)

    def forget(self, key: Hashable) -> None:
        for slot in [s for s in self._sent if s[0] == key]:
            del self._sent[slot]
