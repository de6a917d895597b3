"""`backup`: a `Backup` resource for the cluster (api/backup.py), named `<cluster>-<UTC time>` unless
`--name` is given; `--wait` follows it to Completed or Failed."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from typing import Any

from lightkube.core.exceptions import ApiError

from pg_operator import objects
from pg_operator.api.backup import BACKUP_KIND
from pg_operator.api.constants import API_VERSION
from pg_operator.cli.pgc.connection import Backup, Connection, api_error, as_dict, get_cluster
from pg_operator.cli.pgc.errors import NOT_READY, OK, REFUSED, PgcError

MAX_NAME = 63


def backup_name(cluster: str, now: datetime) -> str:
    stamp = now.strftime("%Y%m%d%H%M%S")
    return f"{cluster[: MAX_NAME - len(stamp) - 1].rstrip('-')}-{stamp}"


def backup_body(name: str, namespace: str, cluster: str) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": BACKUP_KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"cluster": cluster},
    }


def describe(status: dict[str, Any]) -> str:
    """One line of a Backup's status."""
    phase = status.get("phase") or "Pending"
    if phase == "Completed":
        return (
            f"Completed: {status.get('backupID')} on {status.get('instance')}, "
            f"{status.get('size') or 0} bytes, WAL {status.get('beginWal')}..{status.get('endWal')}"
        )
    if phase == "Failed":
        return f"Failed: {status.get('error') or 'no reason given'}"
    return phase


def run(conn: Connection, cluster: str, name: str | None, wait: bool, timeout: float) -> int:
    body = get_cluster(conn, cluster)
    if not objects.spec(body).get("backup"):
        raise PgcError(f"{cluster} has no spec.backup: there is no store to back up to", NOT_READY)
    name = name or backup_name(cluster, datetime.now(UTC))
    try:
        conn.client.create(Backup.from_dict(backup_body(name, conn.namespace, cluster)))
    except ApiError as exc:
        raise api_error(exc) from None
    print(f"backup {conn.namespace}/{name} created")
    if not wait:
        return OK
    deadline, said = time.monotonic() + timeout, ""
    while True:
        try:
            found = as_dict(conn.client.get(Backup, name, namespace=conn.namespace))
            status = dict(found.get("status") or {})
        except ApiError as exc:
            raise api_error(exc) from None
        line = describe(status)
        if line != said:
            print(f"  {line}", file=sys.stderr)
            said = line
        if status.get("phase") == "Completed":
            return OK
        if status.get("phase") == "Failed":
            return REFUSED
        if time.monotonic() > deadline:
            raise PgcError(
                f"backup {name} is still {status.get('phase') or 'Pending'} after {timeout:.0f}s", REFUSED
            )
        time.sleep(2)
