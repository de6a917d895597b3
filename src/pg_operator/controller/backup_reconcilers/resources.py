"""lightkube resources of the backup kinds."""

from __future__ import annotations

from lightkube.generic_resource import create_namespaced_resource

from pg_operator.api.backup import BACKUP_KIND, BACKUP_PLURAL, SCHEDULED_BACKUP_KIND, SCHEDULED_BACKUP_PLURAL
from pg_operator.api.constants import GROUP, VERSION

BackupResource = create_namespaced_resource(GROUP, VERSION, BACKUP_KIND, BACKUP_PLURAL)
ScheduledBackupResource = create_namespaced_resource(
    GROUP, VERSION, SCHEDULED_BACKUP_KIND, SCHEDULED_BACKUP_PLURAL
)
