"""lightkube resources of the backup kinds and Events on any object."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from lightkube.generic_resource import create_namespaced_resource

from pg_operator.api.backup import BACKUP_KIND, BACKUP_PLURAL, SCHEDULED_BACKUP_KIND, SCHEDULED_BACKUP_PLURAL
from pg_operator.api.constants import API_VERSION, GROUP, VERSION
from pg_operator.controller.events import COMPONENT

BackupResource = create_namespaced_resource(GROUP, VERSION, BACKUP_KIND, BACKUP_PLURAL)
ScheduledBackupResource = create_namespaced_resource(
    GROUP, VERSION, SCHEDULED_BACKUP_KIND, SCHEDULED_BACKUP_PLURAL
)


def object_event(
    obj: dict[str, Any], event_type: str, reason: str, message: str, instance: str
) -> dict[str, Any]:
    """A core/v1 Event about any namespaced object of ours (Backup, ScheduledBackup, PostgresCluster)."""
    meta = obj.get("metadata") or {}
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta.get('name')}.", "namespace": meta.get("namespace")},
        "involvedObject": {
            "apiVersion": obj.get("apiVersion") or API_VERSION,
            "kind": obj.get("kind"),
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
