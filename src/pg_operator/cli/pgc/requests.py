"""`switchover` and `restart`: requests the operator carries out, written as annotations on the cluster
(the operator clears each once it is answered), and the optional wait for the answer.

- `db.example.com/switchover-to`: an instance name or `auto` (controller/reconcilers/high_availability.py).
- `db.example.com/restart-requested`: a UTC timestamp; the operator restarts PostgreSQL in every
  instance one at a time, replicas first and the primary last in place, then clears the request
  (orchestration/requested_restart.py)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Event
from lightkube.types import PatchType

from pg_operator import objects
from pg_operator.cli.pgc.connection import Connection, PostgresCluster, api_error, as_dict, get_cluster
from pg_operator.cli.pgc.errors import NOT_FOUND, NOT_READY, OK, REFUSED, PgcError
from pg_operator.orchestration.requested_restart import RESTART_ANNOTATION

# The operator's name for it (controller/reconcilers/high_availability.py; tests/unit/cli/pgc checks they
# match).
SWITCHOVER_ANNOTATION = "db.example.com/switchover-to"
POLL_SECONDS = 1.0


def switchover_target(status: Mapping[str, Any], to: str) -> str | None:
    """Check a switchover request against the cluster's status: None when it is worth sending, else
    the reason it is not; raises PgcError for a request that cannot be right."""
    instances = [i for i in status.get("instances") or []]
    primary = status.get("currentPrimary") or ""
    names = [str(i.get("name")) for i in instances]
    replicas = [str(i.get("name")) for i in instances if i.get("role") == "replica"]
    if to == "auto":
        if not replicas:
            raise PgcError("no replica to switch over to", NOT_READY)
        return None
    if to not in names:
        raise PgcError(
            f'"{to}" is not an instance of this cluster; instances: {", ".join(names) or "none"}', NOT_FOUND
        )
    if to == primary:
        return f"{to} is the primary already"
    return None


def _annotate(conn: Connection, name: str, key: str, value: str) -> None:
    try:
        conn.client.patch(
            PostgresCluster,
            name,
            {"metadata": {"annotations": {key: value}}},
            namespace=conn.namespace,
            patch_type=PatchType.MERGE,
        )
    except ApiError as exc:
        raise api_error(exc) from None


def latest_event(events: Sequence[Mapping[str, Any]], reasons: Sequence[str]) -> Mapping[str, Any] | None:
    """The newest Event with one of `reasons` (by lastTimestamp, else eventTime, else creation)."""

    def when(e: Mapping[str, Any]) -> str:
        meta = objects.meta(e)
        return str(e.get("lastTimestamp") or e.get("eventTime") or meta.get("creationTimestamp") or "")

    matching = [e for e in events if e.get("reason") in reasons]
    return max(matching, key=when, default=None)


def _events(conn: Connection, name: str) -> list[dict[str, Any]]:
    found = conn.client.list(
        Event,
        namespace=conn.namespace,
        fields={"involvedObject.name": name, "involvedObject.kind": "PostgresCluster"},
    )
    return [as_dict(e) for e in found]


def _wait_cleared(
    conn: Connection, name: str, key: str, timeout: float, progress: Callable[[Mapping[str, Any]], str]
) -> Mapping[str, Any]:
    deadline = time.monotonic() + timeout
    said = ""
    while True:
        cluster = get_cluster(conn, name)
        if not objects.annotation(cluster, key):
            return cluster
        now_saying = progress(cluster)
        if now_saying and now_saying != said:
            print(f"  {now_saying}", file=sys.stderr)
            said = now_saying
        if time.monotonic() > deadline:
            raise PgcError(
                f"still pending after {timeout:.0f}s ({key} is set); the operator says: "
                f"{objects.status(cluster).get('phase') or 'nothing'}",
                REFUSED,
            )
        time.sleep(POLL_SECONDS)


def _phase(cluster: Mapping[str, Any]) -> str:
    return str(objects.status(cluster).get("phase") or "")


def switchover(conn: Connection, name: str, to: str, wait: bool, timeout: float) -> int:
    cluster = get_cluster(conn, name)
    status = objects.status(cluster)
    already = switchover_target(status, to)
    if already:
        print(already)
        return OK
    old_primary = str(status.get("currentPrimary") or "")
    started = datetime.now(UTC)
    _annotate(conn, name, SWITCHOVER_ANNOTATION, to)
    print(f"switchover of {conn.namespace}/{name} to {to} requested (primary now: {old_primary or 'none'})")
    if not wait:
        return OK
    _wait_cleared(conn, name, SWITCHOVER_ANNOTATION, timeout, _phase)
    # The request is answered; the status may take a reconcile to show the new primary.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        primary = str(objects.status(get_cluster(conn, name)).get("currentPrimary") or "")
        if primary and primary != old_primary and (to == "auto" or primary == to):
            print(f"{primary} is the primary")
            return OK
        time.sleep(POLL_SECONDS)
    refused = latest_event(_events(conn, name), ("SwitchoverRefused",))
    if refused is not None and (objects.meta(refused).get("creationTimestamp") or "") >= started.strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    ):
        raise PgcError(f"the operator refused the switchover: {refused.get('message')}", REFUSED)
    raise PgcError(f"the request was answered but the primary is still {old_primary}", REFUSED)


def restart(conn: Connection, name: str, wait: bool, timeout: float) -> int:
    get_cluster(conn, name)  # a clear error for a wrong name before writing anything
    token = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    _annotate(conn, name, RESTART_ANNOTATION, token)
    print(f"rolling restart of {conn.namespace}/{name} requested ({RESTART_ANNOTATION}={token})")
    if not wait:
        return OK
    _wait_cleared(conn, name, RESTART_ANNOTATION, timeout, _phase)
    print("every instance restarted")
    return OK
