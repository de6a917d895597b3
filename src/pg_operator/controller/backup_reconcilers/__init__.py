"""The controller side of backups, one reconciler per kind: Backups (backups.py), ScheduledBackups
(scheduled_backups.py) and a cluster's backup side (cluster_backups.py: archiving and backup conditions,
retention, the object-store finalizer). Each runs on a ReconcileLoop of its own (loops.py), so a failure
here never holds up a cluster's own reconcile."""
