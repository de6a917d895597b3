"""Bootstrapping a new cluster from another cluster's backups: point-in-time recovery.

Patroni's custom bootstrap method runs barman-cloud-restore into the empty data directory, then starts
PostgreSQL with the recovery settings below: WAL is fetched from the source's archive up to the target,
and the server promotes onto a new timeline. The new cluster archives under its own server name (its own
cluster name) — never into the source's path, which stays as it was and can serve other restores.
"""

from __future__ import annotations

import datetime as dt
import re
import shlex
from dataclasses import dataclass
from typing import Any

from pg_operator.api.backup import BACKUP_ID_PATTERN, LSN_PATTERN, archive_conflict, parse_rfc3339
from pg_operator.api.parameters import RECOVERY_SETTINGS
from pg_operator.backup.barman import (
    ACCESS_KEY_ENV,
    REGION_ENV,
    SECRET_KEY_ENV,
    SESSION_TOKEN_ENV,
    ObjectStore,
    check_wal_archive_argv,
    restore_argv,
    restore_command,
)

BOOTSTRAP_METHOD = "pgop_restore"
# The source's credentials sit in the pod under these prefixed names (the cluster's own destination uses
# the plain AWS_* ones); commands that read the source map them back for their own process only.
SOURCE_ENV_PREFIX = "PGOP_SOURCE_"


def source_env_names(*, session_token: bool = False) -> dict[str, str]:
    """barman-cloud variable → the pod variable holding the source's value."""
    names = [ACCESS_KEY_ENV, SECRET_KEY_ENV, REGION_ENV] + ([SESSION_TOKEN_ENV] if session_token else [])
    return {n: SOURCE_ENV_PREFIX + n for n in names}


def _with_source_env(command: str, *, session_token: bool) -> str:
    # Shell assignments by reference ("$VAR"): the values are expanded by the shell into the child's
    # environment and never appear in the command line.
    assignments = " ".join(f'{n}="${p}"' for n, p in source_env_names(session_token=session_token).items())
    return f"{assignments} {command}"


@dataclass(frozen=True)
class RecoveryTarget:
    """Where recovery stops: a time, an LSN, or (neither) the end of the archive."""

    time: str | None = None
    lsn: str | None = None
    backup_id: str | None = None  # a specific base backup; by default barman picks one

    def __post_init__(self) -> None:
        if self.time is not None and self.lsn is not None:
            raise ValueError("recovery: set at most one of targetTime and targetLSN")
        if self.time is not None:
            parse_rfc3339(self.time)
        if self.lsn is not None and not re.match(LSN_PATTERN, self.lsn):
            raise ValueError(f"recovery.targetLSN: {self.lsn!r} must look like 0/3000060")
        if self.backup_id is not None and not re.match(BACKUP_ID_PATTERN, self.backup_id):
            raise ValueError(
                f"recovery.backupID: {self.backup_id!r} must be a barman backup ID like 20261201T083000"
            )

    @property
    def postgres_time(self) -> str | None:
        """The target time as PostgreSQL reads it unambiguously: ISO 8601 with microseconds and +00."""
        if self.time is None:
            return None
        return parse_rfc3339(self.time).astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f+00")


def recovery_conflict(source: ObjectStore, own: ObjectStore | None) -> str | None:
    """Why the new cluster's archive would collide with the source's, or None when it cannot (the API's
    rule, `api.backup.archive_conflict`, on the stores' locations)."""
    return archive_conflict(source.location, own.location if own is not None else None)


def recovery_settings(
    source: ObjectStore, target: RecoveryTarget, *, session_token: bool = False
) -> dict[str, str]:
    """PostgreSQL recovery settings (Patroni's bootstrap `recovery_conf`, or postgresql.auto.conf next to
    recovery.signal): WAL from the source's archive, stop at the target, promote onto a new timeline.
    restore_command is run by a shell, which maps the source's credentials in."""
    settings = {
        "restore_command": _with_source_env(restore_command(source), session_token=session_token),
        "recovery_target_timeline": "latest",
    }
    if target.time is not None:
        settings["recovery_target_time"] = target.postgres_time or ""
    if target.lsn is not None:
        settings["recovery_target_lsn"] = target.lsn
    if target.time is not None or target.lsn is not None:
        # Without a target PostgreSQL replays to the end of the archive and promotes by itself.
        settings["recovery_target_action"] = "promote"
    return settings


def restore_base_backup_argv(source: ObjectStore, target: RecoveryTarget, pgdata: str) -> list[str]:
    return restore_argv(
        source,
        pgdata,
        backup_id=target.backup_id,
        target_time=target.postgres_time,
        target_lsn=target.lsn,
    )


# Settings a restored postgresql.auto.conf (ALTER SYSTEM of the source) may carry that would make the new
# cluster archive into the source's path or follow the source's recovery: they override Patroni's
# postgresql.conf, so they are removed right after the restore.
SOURCE_ONLY_SETTINGS: tuple[str, ...] = (
    "archive_command",
    "archive_library",
    "archive_mode",
    "primary_conninfo",
    "primary_slot_name",
    *RECOVERY_SETTINGS,
)


def scrub_auto_conf_command(pgdata: str) -> str:
    """Shell: delete SOURCE_ONLY_SETTINGS lines from the restored postgresql.auto.conf, if there is one."""
    auto = shlex.quote(f"{pgdata.rstrip('/')}/postgresql.auto.conf")
    names = "|".join(SOURCE_ONLY_SETTINGS)
    expression = shlex.quote(f"/^[[:space:]]*({names})[[:space:]]*=/d")
    return f"{{ [ ! -f {auto} ] || sed -i -E {expression} {auto}; }}"


def bootstrap_command(
    source: ObjectStore,
    target: RecoveryTarget,
    pgdata: str,
    own: ObjectStore | None,
    *,
    session_token: bool = False,
) -> str:
    """The command Patroni runs to create the data directory. Patroni splits it with shlex and runs it
    without a shell; `sh -c` chains the check of the new cluster's own archive (it must hold no WAL, or
    two clusters would write one history; own credentials), the restore (source credentials), and the
    removal of the source's archive/recovery settings from the restored postgresql.auto.conf."""
    conflict = recovery_conflict(source, own)
    if conflict:
        raise ValueError(conflict)
    restore = shlex.join(restore_base_backup_argv(source, target, pgdata))
    restore = _with_source_env(restore, session_token=session_token)
    steps = [restore, scrub_auto_conf_command(pgdata)]
    if own is not None:
        steps.insert(0, shlex.join(check_wal_archive_argv(own)))
    return shlex.join(["/bin/sh", "-c", " && ".join(steps)])


def patroni_bootstrap(
    source: ObjectStore,
    target: RecoveryTarget,
    pgdata: str,
    own: ObjectStore | None,
    *,
    session_token: bool = False,
) -> dict[str, Any]:
    """Keys for Patroni's `bootstrap` section: the custom method replaces initdb."""
    return {
        "method": BOOTSTRAP_METHOD,
        BOOTSTRAP_METHOD: {
            "command": bootstrap_command(source, target, pgdata, own, session_token=session_token),
            # No --scope/--datadir appended: the command names the data directory itself.
            "no_params": True,
            "keep_existing_recovery_conf": False,
            "recovery_conf": recovery_settings(source, target, session_token=session_token),
        },
    }
