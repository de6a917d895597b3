"""Backups, WAL archiving and point-in-time recovery with barman-cloud. Pure: command lines (argv), the
PostgreSQL/Patroni settings, cron schedules, retention decisions and failure reasons; the controller
and the instance entrypoint run the commands."""
