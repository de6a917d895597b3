"""The instance's /metrics endpoint (port 9187, HTTPS with the pod's server certificate): one kept
connection over the Unix socket, switched to the least-privileged `pgop_monitor` role (a member of
pg_monitor), runs metrics.py's queries on each scrape. It runs as a daemon thread of the entrypoint, next
to Patroni (whose own /metrics stays on 8008), and answers `pg_up 0` while PostgreSQL is not there.

Why in the entrypoint rather than postgres_exporter: the image already holds Python and psycopg, so this
adds no binary, no Go build and no second process per pod; the queries are ours to keep cheap and to
name as postgres_exporter does (docs/monitoring.md).
"""

from __future__ import annotations

import os
import ssl
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from pg_operator import tls_server
from pg_operator.api.constants import MONITOR_ROLE
from pg_operator.instance import metrics as m
from pg_operator.instance.metrics_custom_runner import CustomQueries
from pg_operator.privileged_sql import PINNED_SEARCH_PATH

# A scrape must never hang on a stuck PostgreSQL (Prometheus' default scrape timeout is 10 s).
STATEMENT_TIMEOUT_MS = 5000
# The tenant's queries run after the built-in set, each within the same statement timeout, and stop
# once the scrape has run this long: the answer still beats Prometheus' timeout.
CUSTOM_BUDGET_SECONDS = 8.0
CONNECT_TIMEOUT_SECONDS = 3
APPLICATION_NAME = "pg-operator-metrics"


def _log(message: str) -> None:
    print(f"pg-operator-instance metrics: {message}", file=sys.stderr, flush=True)


class Collector:
    """One connection, reused across scrapes and re-opened after an error; scrapes run one at a time."""

    def __init__(
        self, *, socket_dir: str, port: int, login_user: str = MONITOR_ROLE, custom_file: str | None = None
    ) -> None:
        self.socket_dir = socket_dir
        self.custom = CustomQueries(custom_file)
        self.port = port
        # The monitoring role itself, through its own peer map (session_roles.py): the session holds no
        # more than pg_monitor, with no superuser to RESET back to.
        self.login_user = login_user
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()
        self.scrapes = 0
        self.errors = 0
        self.last_error = ""
        self._sizes: dict[str, float] = {}
        self._sizes_at: float | None = None  # monotonic time of the last size query

    def _connect(self, dbname: str = "postgres") -> psycopg.Connection[Any]:
        conn = psycopg.connect(
            host=self.socket_dir,
            port=self.port,
            dbname=dbname,
            user=self.login_user,
            application_name=APPLICATION_NAME,
            connect_timeout=CONNECT_TIMEOUT_SECONDS,
            autocommit=True,
            row_factory=dict_row,
            # Tenants own databases and may set their search path; this session names nothing through it.
            options=PINNED_SEARCH_PATH,
        )
        try:
            conn.execute(sql.SQL("SET statement_timeout = {}").format(sql.Literal(STATEMENT_TIMEOUT_MS)))
        except BaseException:
            conn.close()
            raise
        return conn

    def _query(self, conn: psycopg.Connection[Any], text: str, counter: list[int]) -> list[dict[str, Any]]:
        counter[0] += 1
        return conn.execute(text).fetchall()

    def _read(self, conn: psycopg.Connection[Any], out: m.Families, counter: list[int]) -> bool:
        """The built-in set into `out`; whether the instance is in recovery (a replica)."""
        (instance,) = self._query(conn, m.INSTANCE_SQL, counter)
        m.instance_samples(out, instance)
        databases = self._query(conn, m.DATABASE_SQL, counter)
        m.activity_samples(out, self._query(conn, m.ACTIVITY_SQL, counter), m.database_names(databases))
        if self._sizes_at is None or time.monotonic() - self._sizes_at >= m.SIZES_MAX_AGE_SECONDS:
            rows = self._query(conn, m.SIZES_SQL, counter)
            self._sizes = {str(r["datname"]): float(r["size_bytes"]) for r in rows}
            self._sizes_at = time.monotonic()
        m.database_samples(out, databases, self._sizes)
        m.lock_samples(out, self._query(conn, m.LOCKS_SQL, counter), m.database_names(databases))
        m.replication_samples(out, self._query(conn, m.REPLICATION_SQL, counter))
        (archiver,) = self._query(conn, m.ARCHIVER_SQL, counter)
        m.archiver_samples(out, archiver)
        (checkpoints,) = self._query(conn, m.checkpoints_sql(int(instance["version_num"])), counter)
        m.checkpoint_samples(out, checkpoints)
        return bool(instance["in_recovery"])

    def collect(self) -> str:
        with self._lock:
            started, cpu_started = time.monotonic(), time.thread_time()
            out, counter, up = m.Families(), [0], True
            custom: list[m.Family] = []
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = self._connect()
                in_recovery = self._read(self._conn, out, counter)
                custom = self.custom.collect(
                    self._conn, in_recovery=in_recovery, deadline=started + CUSTOM_BUDGET_SECONDS,
                    timeout_ms=STATEMENT_TIMEOUT_MS, counter=counter, connect=self._connect,
                )  # fmt: skip
            except psycopg.Error as e:
                up = False
                out = m.Families()  # no half scrape: only pg_up 0 and the exporter's own figures
                message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                if message != self.last_error:
                    _log(f"cannot read PostgreSQL: {message}")
                self.last_error = message
                self.errors += 1
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
            else:
                if self.last_error:
                    _log("reading PostgreSQL again")
                self.last_error = ""
            self.scrapes += 1
            now = time.monotonic()
            sizes_age = None if self._sizes_at is None or not up else now - self._sizes_at
            stats = m.ScrapeStats(
                up=up, seconds=now - started, cpu_seconds=time.thread_time() - cpu_started,
                queries=counter[0], sizes_age=sizes_age,
            )  # fmt: skip
            m.exporter_samples(out, stats, self.scrapes, self.errors)
            return m.render([*out, *custom, *self.custom.own_families()])

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            self.custom.close()


NOT_FOUND = tls_server.Response(404, "text/plain; charset=utf-8", b"not found: the endpoint is /metrics\n")


class MetricsServer(tls_server.BoundedHttpsServer):
    """HTTP, or HTTPS when given a certificate: the certificate is read again when its file changes (the
    entrypoint installs a renewed one), checked before each accepted connection. Connections are capped
    and given deadlines (pg_operator.tls_server): a peer may hold a socket for a while, never a thread."""

    def __init__(
        self,
        address: tuple[str, int],
        collect: Callable[[], str],
        *,
        cert: str | None = None,
        key: str | None = None,
        limits: tls_server.ServerLimits = tls_server.DEFAULT_LIMITS,
    ) -> None:
        self.collect = collect
        self._cert, self._key = cert, key
        self._context: ssl.SSLContext | None = None
        self._cert_mtime = 0.0
        super().__init__(address, self._answer, self._tls_context, limits)

    def _answer(self, path: str) -> tls_server.Response:
        if path.split("?")[0] != "/metrics":
            return NOT_FOUND
        return tls_server.Response(200, m.CONTENT_TYPE, self.collect().encode())

    def _tls_context(self) -> ssl.SSLContext | None:
        if self._cert is None or self._key is None:
            return None
        try:
            mtime = os.stat(self._cert).st_mtime
        except OSError:
            return self._context
        if self._context is None or mtime != self._cert_mtime:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.load_cert_chain(self._cert, self._key)
            self._context, self._cert_mtime = context, mtime
        return self._context


def start(
    *,
    socket_dir: str,
    pg_port: int,
    login_user: str,
    listen_host: str,
    port: int,
    cert: str | None,
    key: str | None,
    custom_file: str | None = None,
) -> MetricsServer:
    """Serve /metrics from a daemon thread; returns the server (its server_address holds the port).
    `custom_file`: the tenant's queries.yaml, if the cluster declares one (it may not exist yet)."""
    collector = Collector(socket_dir=socket_dir, port=pg_port, login_user=login_user, custom_file=custom_file)
    server = MetricsServer((listen_host, port), collector.collect, cert=cert, key=key)
    server.start("metrics")
    scheme = "https" if cert else "http"
    where = f"{listen_host or '*'}:{server.server_address[1]}"
    _log(f"serving {scheme}://{where}/metrics as role {collector.login_user}")
    return server
