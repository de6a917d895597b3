"""Backups, WAL archiving and point-in-time recovery with barman-cloud. Pure: command lines (argv), the
PostgreSQL/Patroni settings, cron evaluation, retention decisions, failure reasons and a Backup's next
step; the controller and the instance entrypoint run the commands.

It imports `api` (the patterns and limits it checks against, the models it reads through `from_spec`)
and the leaves `objects` and `images`; nothing of specs, instance, orchestration or controller.
"""
