"""Which instance a base backup runs on.

barman-cloud-backup uses PostgreSQL's non-exclusive backup API (pg_backup_start / pg_backup_stop), which
PostgreSQL 16 allows on a hot standby; barman skips the restore point there (a standby cannot create one)
and takes the backup otherwise the same way. So a healthy replica takes it, sparing the primary the
read load, and the primary only when no replica is fit. The backup's last WAL segment is written by the
primary: after a standby backup the controller asks the primary for a WAL switch, so the segment is
archived at once instead of after archive_timeout.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pg_operator import objects
from pg_operator.api.constants import CLUSTER_LABEL, ROLE_LABEL

PRIMARY_ROLES = ("primary", "master")


@dataclass(frozen=True)
class Placement:
    pod: str
    role: str  # "replica" or "primary"
    reason: str  # why this one, for the Backup's Event


def _ready(pod: Mapping[str, Any]) -> bool:
    status = objects.status(pod)
    return status.get("phase") == "Running" and objects.condition_status(status, "Ready") == "True"


def _patroni_state(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    raw = objects.annotation(pod, "status") or "{}"
    try:
        parsed = json.loads(raw)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, Mapping) else {}


def _fit_replica(pod: Mapping[str, Any], primary_timeline: int | None) -> bool:
    state = _patroni_state(pod)
    if state.get("state") not in (None, "running", "streaming"):
        return False
    # Patroni ≥ 3 reports how the replica follows: only one that streams from the primary is current.
    replication = state.get("replication_state")
    if replication is not None and replication != "streaming":
        return False
    timeline = state.get("timeline")
    return primary_timeline is None or timeline is None or timeline == primary_timeline


def choose_instance(
    pods: Sequence[Mapping[str, Any]], cluster: str, *, prefer_replica: bool = True
) -> Placement | None:
    """A ready, streaming replica (by name, for a stable choice); else the ready primary; else None."""
    mine = [p for p in pods if objects.label(p, CLUSTER_LABEL) == cluster and not objects.deleting(p)]
    mine = [p for p in mine if _ready(p)]
    mine.sort(key=objects.name)
    primaries = [p for p in mine if objects.label(p, ROLE_LABEL) in PRIMARY_ROLES]
    primary_timeline = _patroni_state(primaries[0]).get("timeline") if primaries else None
    if prefer_replica:
        for pod in mine:
            if objects.label(pod, ROLE_LABEL) == "replica" and _fit_replica(
                pod, primary_timeline if isinstance(primary_timeline, int) else None
            ):
                return Placement(objects.name(pod), "replica", "a healthy replica takes it")
    if primaries:
        why = "no ready, streaming replica: on the primary" if prefer_replica else "on the primary"
        return Placement(objects.name(primaries[0]), "primary", why)
    return None


def primary_pod(pods: Sequence[Mapping[str, Any]], cluster: str) -> str | None:
    """The ready primary's name (the one that archives WAL)."""
    for pod in sorted(pods, key=objects.name):
        if (
            objects.label(pod, CLUSTER_LABEL) == cluster
            and objects.label(pod, ROLE_LABEL) in PRIMARY_ROLES
            and not objects.deleting(pod)
            and _ready(pod)
        ):
            return objects.name(pod)
    return None
