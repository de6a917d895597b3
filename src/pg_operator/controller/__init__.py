"""The operator process: behind a Lease, informers (`informer`) feeding the watch cache (`cache`,
`cache_sync`, `wakeups`), the
work loop (`loop`, `workqueue`, `backoff`), the cluster reconcile (`reconcile`) and its capability
sub-reconcilers (`reconcilers/`), the backup reconcilers (`backup_reconcilers/`), writes (`writes`, `diff`,
`kube_api`), Events, metrics and health endpoints.

May import every package but `cli`; nothing below it imports the controller.
"""
