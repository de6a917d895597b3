"""`logs`: every instance's log (the database container) in one stream, merged by the kubelet's
timestamps and prefixed with the instance; `-f` follows all of them (lines print as they arrive)."""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Iterable, Mapping, Sequence

from lightkube.core.exceptions import ApiError

from pg_operator import objects
from pg_operator.api.constants import CONTAINER_NAME
from pg_operator.cli.pgc.connection import Connection, cluster_pods, get_cluster
from pg_operator.cli.pgc.errors import FAILED, NOT_FOUND, OK, PgcError

Line = tuple[tuple[str, str], str, str, str]  # (sort key, pod, timestamp, text)


def split_timestamp(line: str) -> tuple[tuple[str, str], str, str]:
    """A line the kubelet prefixed with an RFC 3339 timestamp (`--timestamps`): (sort key, timestamp,
    text). The kubelet drops trailing zeros of the fraction, so the key pads it to nanoseconds; a line
    without a timestamp sorts first."""
    stamp, _, text = line.partition(" ")
    if len(stamp) < 20 or stamp[10] != "T" or not stamp.endswith("Z"):
        return ("", ""), "", line
    seconds, _, fraction = stamp[:-1].partition(".")
    return (seconds, fraction.ljust(9, "0")), stamp, text


def merge(streams: Mapping[str, Iterable[str]]) -> list[Line]:
    """Every pod's lines in time order; lines of one pod keep their order among equal timestamps."""
    lines: list[Line] = []
    for pod, stream in streams.items():
        for raw in stream:
            key, stamp, text = split_timestamp(raw.rstrip("\n"))
            lines.append((key, pod, stamp, text))
    return sorted(lines, key=lambda line: line[0])  # stable: each pod's own order survives


def format_line(pod: str, stamp: str, text: str, width: int, timestamps: bool) -> str:
    return f"{stamp + ' ' if timestamps and stamp else ''}{pod.ljust(width)} | {text}"


def _pods(conn: Connection, name: str, instance: str | None) -> list[str]:
    get_cluster(conn, name)
    pods = [objects.name(p) for p in cluster_pods(conn, name)]
    if instance:
        if instance not in pods:
            raise PgcError(f'no instance "{instance}"; instances: {", ".join(pods) or "none"}', NOT_FOUND)
        return [instance]
    if not pods:
        raise PgcError(f"{name} has no instance pods", NOT_FOUND)
    return pods


def run(
    conn: Connection,
    name: str,
    *,
    follow: bool,
    since: int | None,
    tail: int | None,
    instance: str | None,
    timestamps: bool,
) -> int:
    pods = _pods(conn, name, instance)
    width = max(len(p) for p in pods)
    if follow:
        return _follow(conn, pods, since, tail, width, timestamps)
    streams: dict[str, Sequence[str]] = {}
    failed = False
    for pod in pods:
        try:
            streams[pod] = list(
                conn.client.log(
                    pod,
                    namespace=conn.namespace,
                    container=CONTAINER_NAME,
                    since=since,
                    tail_lines=tail,
                    timestamps=True,
                )
            )
        except ApiError as exc:
            failed = True
            print(f"{pod}: no log: {exc.status.message}", file=sys.stderr)
    for _, pod, stamp, text in merge(streams):
        print(format_line(pod, stamp, text, width, timestamps))
    return FAILED if failed and not streams else OK


def _follow(
    conn: Connection, pods: Sequence[str], since: int | None, tail: int | None, width: int, timestamps: bool
) -> int:
    lines: queue.Queue[tuple[str, str | None]] = queue.Queue()
    client = conn.streaming_client()

    def read(pod: str) -> None:
        try:
            for raw in client.log(
                pod,
                namespace=conn.namespace,
                container=CONTAINER_NAME,
                follow=True,
                since=since,
                tail_lines=tail,
                timestamps=True,
            ):
                lines.put((pod, raw))
            lines.put((pod, None))
        except Exception as exc:  # the pod went away or its container is not running
            lines.put((pod, f"\x00{exc}"))

    for pod in pods:
        threading.Thread(target=read, args=(pod,), daemon=True).start()
    open_streams = len(pods)
    try:
        while open_streams:
            pod, raw = lines.get()
            if raw is None or raw.startswith("\x00"):
                open_streams -= 1
                why = raw[1:] if raw else "stream ended"
                print(f"{pod}: {why}", file=sys.stderr)
                continue
            _, stamp, text = split_timestamp(raw.rstrip("\n"))
            print(format_line(pod, stamp, text, width, timestamps), flush=True)
    except KeyboardInterrupt:
        return OK
    return OK
