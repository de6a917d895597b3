"""The instances room: the children that run PostgreSQL (instance RBAC, configuration, Services, the
StatefulSet, its disruption budget), and the Events that say when the StatefulSet was created or scaled."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pg_operator import objects
from pg_operator.controller.events import EventRecorder
from pg_operator.controller.rooms import ClusterPass, Room
from pg_operator.specs import desired_children


class InstancesRoom(Room):
    def __init__(self, events: EventRecorder) -> None:
        self.events = events

    def children(self, p: ClusterPass) -> list[dict[str, Any]]:
        desired = desired_children(p.cluster, existing_statefulset=p.statefulset)
        if p.replicas is not None:
            # The high-availability room holds the size until the primary has moved (scale-down).
            for child in desired:
                if child["kind"] == "StatefulSet":
                    child["spec"]["replicas"] = p.replicas
        return desired

    def holds_back(
        self, p: ClusterPass, desired: Mapping[str, Any], observed: Mapping[str, Any] | None
    ) -> bool:
        # Its volumes could not be provisioned (say, no such StorageClass): create it once they can.
        return desired["kind"] == "StatefulSet" and observed is None and p.problem is not None

    async def applied(
        self, p: ClusterPass, desired: Mapping[str, Any], observed: Mapping[str, Any] | None
    ) -> int:
        if desired["kind"] != "StatefulSet":
            return 0
        want = objects.spec(desired).get("replicas")
        if observed is None:
            message = f"created StatefulSet with {want} instance(s)"
            return int(await self.events.record(p.body, "Normal", "Created", message))
        have = objects.spec(observed).get("replicas")
        if want is not None and have is not None and want != have:
            message = f"scaling from {have} to {want} instance(s)"
            return int(await self.events.record(p.body, "Normal", "Scaled", message))
        return 0
