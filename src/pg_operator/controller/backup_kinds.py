"""lightkube resources of the backup kinds (Backup, ScheduledBackup): importing this module registers them,
so `Api.create_dict` can send a Backup. Below the backup reconcilers and the cluster's sub-reconcilers,
which both use them."""

from __future__ import annotations

from lightkube.generic_resource import create_namespaced_resource

from pg_operator.api.backup import BACKUP_KIND, BACKUP_PLURAL, SCHEDULED_BACKUP_KIND, SCHEDULED_BACKUP_PLURAL
from pg_operator.api.constants import GROUP, VERSION

BackupResource = create_namespaced_resource(GROUP, VERSION, BACKUP_KIND, BACKUP_PLURAL)
ScheduledBackupResource = create_namespaced_resource(
    GROUP, VERSION, SCHEDULED_BACKUP_KIND, SCHEDULED_BACKUP_PLURAL
)
