"""The pooler pod's supervisor (`pg-operator-pooler`): renders pgbouncer.ini from the environment and the
mounted Secrets, runs PgBouncer as a non-root child, serves its metrics on pgbouncer_exporter's names,
bounds a pause with a watchdog, and offers the subcommands the operator execs (`point`, `pause`,
`resume`, `show`) over PgBouncer's admin console on the Unix socket. See docs/pooler.md.

Imports the standard library only (the pod's memory): nothing of pydantic, `api` or the controller.
"""
