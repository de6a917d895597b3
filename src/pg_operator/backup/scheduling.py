"""A ScheduledBackup's pass (pure): whether to create a Backup now, which one, and the status to write.

Backup names are derived from the scheduled time, so creating one twice (an operator restart between the
create and the status write) finds the first one instead of making a second.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pg_operator import objects
from pg_operator.api.backup import SCHEDULED_BACKUP_LABEL
from pg_operator.api.constants import API_VERSION, CLUSTER_LABEL
from pg_operator.backup import cron

MAX_NAME = 253


def rfc3339(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_stamp(value: Any) -> dt.datetime | None:
    if not value:
        return None
    parsed = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


def backup_name(scheduled_backup: str, scheduled_for: dt.datetime) -> str:
    suffix = scheduled_for.astimezone(dt.UTC).strftime("-%Y%m%d%H%M%S")
    return scheduled_backup[: MAX_NAME - len(suffix)] + suffix


@dataclass(frozen=True)
class SchedulePass:
    backup: dict[str, Any] | None  # the Backup to create now, if any
    status: dict[str, Any]  # the ScheduledBackup's whole .status after this reconcile
    requeue: float  # seconds until the next look


def cluster_hibernating(cluster: Mapping[str, Any] | None) -> bool:
    """The cluster is hibernating, hibernated or waking (spec.hibernation, or status.hibernation while a
    wake is under way): its scheduled backups pause, as if suspended, and the runs missed meanwhile collapse
    into one once it runs again (cron.decide)."""
    if cluster is None:
        return False
    return bool(objects.spec(cluster).get("hibernation")) or bool(objects.status(cluster).get("hibernation"))


def schedule_pass(obj: Mapping[str, Any], now: dt.datetime, *, paused: bool = False) -> SchedulePass:
    """`paused`: the cluster hibernates (cluster_hibernating): no Backup is created."""
    own_name, spec, status = objects.name(obj), objects.spec(obj), dict(objects.status(obj))
    created = parse_stamp(objects.meta(obj).get("creationTimestamp")) or now
    last = parse_stamp(status.get("lastScheduleTime"))
    decision = cron.decide(
        str(spec.get("schedule")),
        now=now,
        created=created,
        last_schedule=last,
        suspend=bool(spec.get("suspend")) or paused,
        immediate=bool(spec.get("immediate")),
    )
    status["nextScheduleTime"] = rfc3339(decision.next_time)
    backup = None
    if decision.due and decision.scheduled_for is not None:
        # The immediate run stands for the creation time, so its name is as stable as a scheduled one's.
        scheduled_for = created if last is None and spec.get("immediate") else decision.scheduled_for
        name = backup_name(own_name, scheduled_for)
        backup = {
            "apiVersion": API_VERSION,
            "kind": "Backup",
            "metadata": {
                "name": name,
                "namespace": objects.namespace(obj),
                "labels": {
                    CLUSTER_LABEL: str(spec.get("cluster")),
                    SCHEDULED_BACKUP_LABEL: own_name,
                },
                "ownerReferences": [
                    {
                        "apiVersion": API_VERSION,
                        "kind": "ScheduledBackup",
                        "name": own_name,
                        "uid": objects.uid(obj),
                    }
                ],
            },
            "spec": {"cluster": str(spec.get("cluster"))},
        }
        status["lastScheduleTime"] = rfc3339(scheduled_for)
        status["lastBackupName"] = name
    wait = (decision.next_time - now).total_seconds()
    return SchedulePass(backup, status, max(1.0, min(wait, 3600.0)))
