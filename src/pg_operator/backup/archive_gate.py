"""The gate in front of archive_command: an instance archives WAL only once the operator has proven that
the cluster owns its store prefix (backup.store_ownership).

archive_command is rendered once, when the instance starts, and PostgreSQL keeps every segment until
archive_command succeeds for it. So the command reads a small gate file the operator writes into the
primary's run directory (the container's own filesystem: it goes with the container, so a recreated
cluster, a restarted container or a new primary starts closed again):

- `archive <token>`: the prefix is this cluster's: run barman-cloud-wal-archive.
- `discard <token>`: the prefix is proven someone else's: exit 0 without uploading. PostgreSQL then
  recycles the segment. The cluster has no archive while this lasts (no point-in-time recovery, which
  the ContinuousArchiving condition says), but its pg_wal does not grow without bound and it keeps
  serving; failing instead would fill the volume and stop the primary, for segments that have nowhere
  to go.
- anything else (no file yet, or a token of another store after `spec.backup.s3` changed): exit 1.
  PostgreSQL keeps the segment and retries; the operator writes the gate within one reconcile (30 s) once the
  store answers, so this wait is short, and while the store does not answer it is the same backlog as
  any failing store (reported, as before).

The token names the store (endpoint, bucket, prefix), so a gate written for one store never opens another.
"""

from __future__ import annotations

import hashlib
import shlex
from typing import Literal

from pg_operator.backup.barman import ObjectStore, wal_archive_argv

GATE_FILE = "pgop-archive-gate"
DEFAULT_GATE_DIR = "/var/run/postgresql"  # the instance's run directory (Unix socket, Patroni's files)

GateState = Literal["archive", "discard"]


def gate_token(store: ObjectStore) -> str:
    identity = f"{store.endpoint_url or ''}\n{store.bucket}\n{store.prefix}"
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


def gate_path(gate_dir: str = DEFAULT_GATE_DIR) -> str:
    return f"{gate_dir.rstrip('/')}/{GATE_FILE}"


def gate_line(state: GateState, store: ObjectStore) -> str:
    return f"{state} {gate_token(store)}"


def gated_archive_command(store: ObjectStore, gate_dir: str = DEFAULT_GATE_DIR) -> str:
    """archive_command: barman-cloud-wal-archive behind the gate (a POSIX sh line; `%p` as PostgreSQL
    substitutes it)."""
    token = gate_token(store)
    archive = shlex.join(wal_archive_argv(store))
    waiting = (
        f"pg-operator: WAL archiving to s3://{store.bucket}/{store.prefix} waits until the operator has "
        "checked who owns that prefix (see the ContinuousArchiving condition)"
    )
    return (
        f'case "$(cat {shlex.quote(gate_path(gate_dir))} 2>/dev/null)" in '
        f"{shlex.quote('archive ' + token)}) exec {archive} ;; "
        f"{shlex.quote('discard ' + token)}) exit 0 ;; "
        f"*) echo {shlex.quote(waiting)} >&2; exit 1 ;; esac"
    )


def write_gate_script(state: GateState, store: ObjectStore, gate_dir: str = DEFAULT_GATE_DIR) -> str:
    """A sh line that writes the gate atomically (rename), for the operator's exec in the primary."""
    path = gate_path(gate_dir)
    tmp = f"{path}.tmp"
    return (
        f"printf '%s\\n' {shlex.quote(gate_line(state, store))} > {shlex.quote(tmp)} && "
        f"mv -f {shlex.quote(tmp)} {shlex.quote(path)}"
    )
