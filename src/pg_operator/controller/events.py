"""Kubernetes Events (core/v1) on our objects (PostgresCluster, Backup, ScheduledBackup). Messages are
built by the controller from names and counts only; no Secret content ever reaches them."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from lightkube import codecs

from pg_operator import objects
from pg_operator.api.constants import API_VERSION, KIND
from pg_operator.controller.cluster_memory import ClusterMemory, RemembersClusters
from pg_operator.controller.kube_api import Api

log = logging.getLogger(__name__)
COMPONENT = "pg-operator"


def event_body(
    obj: dict[str, Any], event_type: str, reason: str, message: str, instance: str
) -> dict[str, Any]:
    """A core/v1 Event about one namespaced object of ours (a PostgresCluster unless it says otherwise)."""
    meta = objects.meta(obj)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta.get('name')}.", "namespace": meta.get("namespace")},
        "involvedObject": {
            "apiVersion": obj.get("apiVersion") or API_VERSION,
            "kind": obj.get("kind") or KIND,
            "name": meta.get("name"),
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
        },
        "type": event_type,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance[:128],
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }


# How long a Warning a sub-reconciler posted stands for the same reason's Degraded transition Warning (both
# come from one reconcile; a later transition deserves its own Event).
RECENT_SECONDS = 60.0
RECENT_KEPT = 4096


class EventRecorder:
    def __init__(self, api: Api, instance: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.instance = instance
        self.clock = clock
        self._warned: dict[tuple[str, str], float] = {}  # (object uid, reason) → when its Warning was posted

    def warned_recently(self, obj: dict[str, Any], reason: str) -> bool:
        """Whether a Warning with this reason about this object was posted within RECENT_SECONDS."""
        at = self._warned.get((objects.uid(obj), reason))
        return at is not None and self.clock() - at < RECENT_SECONDS

    async def record(self, cluster: dict[str, Any], event_type: str, reason: str, message: str) -> bool:
        """Post one Event; failures are logged, never raised (an Event must not fail a reconcile)."""
        try:
            await self.api.create(
                codecs.from_dict(event_body(cluster, event_type, reason, message, self.instance))
            )
        except Exception as exc:
            log.warning("could not post %s event %s: %s", event_type, reason, exc)
            return False
        if event_type == "Warning":
            now = self.clock()
            if len(self._warned) >= RECENT_KEPT:
                self._warned = {k: at for k, at in self._warned.items() if now - at < RECENT_SECONDS}
            self._warned[(objects.uid(cluster), reason)] = now
        return True


class OncePerMessage(RemembersClusters):
    """A sub-reconciler's Warning Events: one per distinct message per cluster; the same message again posts
    nothing until it changes or is forgotten (the problem cleared, the cluster gone)."""

    def __init__(self, events: EventRecorder) -> None:
        self.events = events
        self._last: ClusterMemory[str] = ClusterMemory()

    async def warn(self, cluster: dict[str, Any], reason: str, message: str) -> int:
        """Post the Warning unless it is the one last posted for this cluster; 1 if posted."""
        key = (str(objects.meta(cluster).get("namespace")), str(objects.meta(cluster).get("name")))
        if self._last.get(key) == message:
            return 0
        self._last.set(key, message)
        return int(await self.events.record(cluster, "Warning", reason, message))
