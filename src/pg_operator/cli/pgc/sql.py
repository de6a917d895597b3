"""`psql` (a session in an instance's container, to the primary or a replica) and `reload` (every
running instance re-reads its configuration).

Both exec into the pod with the `kubectl` that runs the plugin (lightkube has no exec): psql connects as
the superuser over the Unix socket with peer authentication, so no password is read, sent or put in a
command line. A terminal is requested only when stdin is one, so SQL can be piped in."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from pg_operator import objects
from pg_operator.api.constants import CONTAINER_NAME, ROLE_PRIMARY, ROLE_REPLICA, SUPERUSER
from pg_operator.cli.pgc.connection import Connection, cluster_pods, get_cluster
from pg_operator.cli.pgc.errors import FAILED, NOT_FOUND, NOT_READY, OK, PgcError

SOCKET_DIR = "/var/run/postgresql"  # as controller/pod_exec.PSQL


def pod_ready(pod: Mapping[str, Any]) -> bool:
    return objects.condition_status(objects.status(pod), "Ready") == "True"


def pick_instance(
    status: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], *, replica: bool, instance: str | None
) -> str:
    """The pod to connect to: the named instance, else the primary, else (with `replica`) the ready
    replica with the least lag."""
    names = [objects.name(p) for p in pods]
    if instance:
        if instance not in names:
            raise PgcError(f'no instance "{instance}"; instances: {", ".join(names) or "none"}', NOT_FOUND)
        return instance
    running = {objects.name(p) for p in pods if pod_ready(p)}
    reported = [i for i in status.get("instances") or [] if i.get("name") in running]
    if not replica:
        primary = status.get("currentPrimary") or next(
            (objects.name(p) for p in pods if objects.label(p, "role") == ROLE_PRIMARY), ""
        )
        if not primary or primary not in names:
            raise PgcError("the cluster has no primary right now", NOT_READY)
        return str(primary)
    replicas = sorted(
        (i for i in reported if i.get("role") == ROLE_REPLICA),
        key=lambda i: (i.get("lagBytes") is None, i.get("lagBytes") or 0, i.get("name")),
    )
    if not replicas:
        raise PgcError("no ready replica", NOT_READY)
    return str(replicas[0]["name"])


def psql_argv(
    conn: Connection, pod: str, dbname: str, extra: Sequence[str], tty: bool, stdin: bool = True
) -> list[str]:
    """kubectl exec of psql as the superuser over the instance's Unix socket."""
    flags = (["-i"] if stdin else []) + (["-t"] if tty else [])
    return conn.kubectl(
        "exec",
        *flags,
        pod,
        "-c",
        CONTAINER_NAME,
        "--",
        "psql",
        "-h",
        SOCKET_DIR,
        "-U",
        SUPERUSER,
        "-d",
        dbname,
        *extra,
    )


def psql(
    conn: Connection, name: str, *, replica: bool, instance: str | None, dbname: str, extra: Sequence[str]
) -> int:
    cluster = get_cluster(conn, name)
    pod = pick_instance(objects.status(cluster), cluster_pods(conn, name), replica=replica, instance=instance)
    if sys.stderr.isatty():
        print(f"connecting to {pod}", file=sys.stderr)
    # psql's own exit code comes back through kubectl exec.
    return subprocess.call(psql_argv(conn, pod, dbname, extra, sys.stdin.isatty()))


RELOAD_SQL = "select pg_reload_conf()"


def reload(conn: Connection, name: str) -> int:
    get_cluster(conn, name)
    pods = [p for p in cluster_pods(conn, name) if pod_ready(p)]
    if not pods:
        raise PgcError("no running instance to reload", NOT_READY)
    failed = []
    for pod in pods:
        argv = psql_argv(
            conn, objects.name(pod), "postgres", ["-AtX", "-c", RELOAD_SQL], tty=False, stdin=False
        )
        res = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        if res.returncode == 0 and res.stdout.strip() == "t":
            print(f"{objects.name(pod)}: configuration reloaded")
        else:
            failed.append(objects.name(pod))
            said = res.stderr.strip() or res.stdout.strip()
            print(f"{objects.name(pod)}: reload failed: {said}", file=sys.stderr)
    return FAILED if failed else OK
