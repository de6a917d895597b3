"""The controller side of backups: Backups, ScheduledBackups, retention, the archiving and backup
conditions of a cluster, and the object-store finalizer. Its own work queue, so a failure here never
holds up a cluster's own reconcile."""
