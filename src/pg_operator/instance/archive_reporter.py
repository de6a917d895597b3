"""The primary's own report on its WAL archiving (backup.archive_report), published in its pod's
annotation: a thread of the instance entrypoint that reads pg_stat_archiver and the archive gate's file
every few seconds and patches its own pod when the report changes.

The report is read in a session of its own role (`pgop_monitor`, a member of pg_monitor: enough for
pg_stat_archiver and the archive status directory), logged in directly over the Unix socket with the
search path pinned (session_roles): never as the superuser.

The patch goes to the API server with the pod's service account, which may patch exactly its cluster's
member pods (Patroni patches the same pod's labels and status annotation). A standby, or a primary
without archive_mode, publishes nothing and removes a report left by an earlier container. Failures are
logged once per kind and retried on the next poll: the operator reads the pod itself while no report is
there.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import tuple_row

from pg_operator.api.constants import MONITOR_ROLE
from pg_operator.backup import archive_report as r
from pg_operator.backup.archive_gate import gate_path
from pg_operator.backup.archive_health import ARCHIVER_QUERY, parse_archiver_line
from pg_operator.instance import session_roles

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
APPLICATION_NAME = "pg-operator-archive-report"
PATCH_TIMEOUT_SECONDS = 10.0
# One row: whether this instance archives at all (a primary with archive_mode on), then pg_stat_archiver.
ARCHIVES_SQL = (
    "SELECT NOT pg_catalog.pg_is_in_recovery() AND pg_catalog.current_setting('archive_mode') <> 'off'"
)


def _log(message: str) -> None:
    print(f"archive-report: {message}", file=sys.stderr, flush=True)


class PodPatcher:
    """Merge-patches this pod through the API server, with the service account's token (re-read on every
    patch: projected tokens rotate) and CA."""

    def __init__(self, namespace: str, pod: str, *, sa_dir: str = SERVICE_ACCOUNT_DIR) -> None:
        self.path = f"/api/v1/namespaces/{namespace}/pods/{pod}"
        self.sa_dir = Path(sa_dir)
        self.host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
        self.port = int(os.environ.get("KUBERNETES_SERVICE_PORT", "443"))

    def patch(self, body: dict[str, Any]) -> None:
        if not self.host:
            raise OSError("KUBERNETES_SERVICE_HOST is not set")
        token = (self.sa_dir / "token").read_text().strip()
        context = ssl.create_default_context(cafile=str(self.sa_dir / "ca.crt"))
        conn = http.client.HTTPSConnection(
            self.host, self.port, context=context, timeout=PATCH_TIMEOUT_SECONDS
        )
        try:
            conn.request("PATCH", self.path, body=json.dumps(body), headers={
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/merge-patch+json",
                "Accept": "application/json",
            })  # fmt: skip
            response = conn.getresponse()
            text = response.read()[:300].decode(errors="replace")
            if response.status >= 300:
                raise OSError(f"PATCH {self.path}: HTTP {response.status}: {text}")
        finally:
            conn.close()


class ArchiveReporter:
    def __init__(self, *, socket_dir: str, pg_port: int, patcher: PodPatcher) -> None:
        self.socket_dir = socket_dir
        self.pg_port = pg_port
        self.patcher = patcher
        self.gate_file = Path(gate_path(socket_dir))
        self._conn: psycopg.Connection[Any] | None = None
        self._last: r.ArchiveReport | None = None
        self._last_at = 0.0
        self._publishing: bool | None = None  # None: not known yet (a report may be left on the pod)
        self._logged: set[str] = set()

    def session(self) -> psycopg.Connection[Any]:
        """The reporter's one kept session, opened again after an error."""
        if self._conn is None or self._conn.closed:
            self._conn = session_roles.connect(
                socket_dir=self.socket_dir, pg_port=self.pg_port, user=MONITOR_ROLE,
                application_name=APPLICATION_NAME, autocommit=True, row_factory=tuple_row,
            )  # fmt: skip
            self._conn.execute("SET statement_timeout = 5000")
        return self._conn

    def read(self) -> r.ArchiveReport | None:
        """The report now, or None when this instance archives nothing (a standby, archive_mode off)."""
        conn = self.session()
        row = conn.execute(ARCHIVES_SQL).fetchone()
        if not row or not row[0]:
            return None
        stats_row = conn.execute(ARCHIVER_QUERY).fetchone()
        if stats_row is None:
            return None
        stats = parse_archiver_line("|".join("" if v is None else str(v) for v in stats_row))
        try:
            gate = self.gate_file.read_text().strip()
        except FileNotFoundError:
            gate = ""
        return r.ArchiveReport(gate=gate, stats=stats)

    def once(self) -> None:
        try:
            report = self.read()
        except (psycopg.Error, OSError, ValueError) as e:
            if self._conn is not None:
                self._conn.close()
            self._once_per_kind("query", f"pg_stat_archiver unreadable (retrying): {e}")
            return
        self._logged.discard("query")  # a later failure is logged again
        now = time.monotonic()
        if report is None:
            if self._publishing is not False:
                self._patch(r.annotation_patch(None), publishing=False)
                self._last = None
            return
        if self._publishing and not r.should_publish(self._last, report, now - self._last_at):
            return
        if self._patch(r.annotation_patch(report), publishing=True):
            self._last, self._last_at = report, now

    def _patch(self, body: dict[str, Any], *, publishing: bool) -> bool:
        try:
            self.patcher.patch(body)
        except OSError as e:
            self._once_per_kind("patch", f"cannot patch the pod's annotation (retrying): {e}")
            return False
        self._publishing = publishing
        self._logged.discard("patch")
        return True

    def _once_per_kind(self, kind: str, message: str) -> None:
        if kind not in self._logged:
            self._logged.add(kind)
            _log(message)

    def run_forever(self) -> None:
        while True:
            time.sleep(r.POLL_SECONDS)
            try:
                self.once()
            except Exception as e:  # whatever it is: a dead thread would leave a stale report for good
                self._once_per_kind("unexpected", f"reporting failed (retrying): {type(e).__name__}: {e}")
            else:
                self._logged.discard("unexpected")


def start(*, socket_dir: str, pg_port: int, namespace: str, pod: str) -> threading.Thread:
    reporter = ArchiveReporter(socket_dir=socket_dir, pg_port=pg_port, patcher=PodPatcher(namespace, pod))
    thread = threading.Thread(target=reporter.run_forever, name="archive-report", daemon=True)
    thread.start()
    return thread
