"""A transaction-mode load for the pooler's e2e test and benchmark: writers of many short transactions
(one INSERT each, autocommit) to one endpoint — the pooler's `-pooler-rw` or the cluster's `-rw` — over
TLS verified against the cluster's CA by the Service's name, each counting failed transactions, the
longest stall (the longest time between two acknowledged commits) and each commit's latency.

A writer on a new connection per transaction (an application without a pool) or on one persistent
connection (reopened only when it broke). Its client timeouts are generous on purpose: a pooler that
holds a transaction while it switches over must be allowed to hold it; what counts is whether the
transaction fails.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from harness.local_cluster import Kube
from harness.pgcluster import secret, service_ip


@dataclass(frozen=True)
class Endpoint:
    """Where and as whom a writer connects."""

    service: str  # the Service's name, checked against the server's certificate
    namespace: str
    ip: str
    user: str
    password: str = field(repr=False)
    dbname: str
    ca_file: str

    def dsn(self) -> dict[str, Any]:
        return {"host": f"{self.service}.{self.namespace}.svc", "hostaddr": self.ip, "port": 5432,
                "user": self.user, "password": self.password, "dbname": self.dbname,
                "sslmode": "verify-full", "sslrootcert": self.ca_file}  # fmt: skip


def endpoint(kube: Kube, namespace: str, cluster: str, service: str,
             secret_name: str | None = None) -> Endpoint:  # fmt: skip
    """An endpoint for `service` with the credentials and CA of `secret_name` (default `<cluster>-app`)."""
    values = secret(kube, namespace, secret_name or f"{cluster}-app")
    ca = Path(tempfile.mkdtemp(prefix="pgop-pooler-")) / "ca.crt"
    ca.write_text(values["ca.crt"])
    return Endpoint(
        service,
        namespace,
        service_ip(kube, namespace, service),
        values["username"],
        values["password"],
        values["dbname"],
        str(ca),
    )


class TxWriter:
    """Inserts numbered rows into `table` through `endpoint` until stopped."""

    def __init__(self, ep: Endpoint, table: str, *, persistent: bool, pause_s: float = 0.02) -> None:
        self.ep, self.table, self.persistent, self.pause_s = ep, table, persistent, pause_s
        self.acked = 0
        self.failures = 0
        self.errors: list[str] = []
        self.latencies: list[float] = []
        self.stall = 0.0  # the longest time between two acknowledged commits
        self._last_ok: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        with psycopg.connect(**ep.dsn(), autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL("create table if not exists {} (id bigserial primary key, "
                                 "at timestamptz default now())").format(sql.Identifier(table)))  # fmt: skip

    def _connect(self) -> psycopg.Connection[Any]:
        # prepare_threshold None: no server-side prepared statements, as transaction pooling requires.
        return psycopg.connect(**self.ep.dsn(), autocommit=True, connect_timeout=60, prepare_threshold=None,
                               tcp_user_timeout=60000)  # fmt: skip

    def _run(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        insert = sql.SQL("insert into {} default values").format(sql.Identifier(self.table))
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                if conn is None:
                    conn = self._connect()
                conn.execute(insert)
                if not self.persistent:
                    conn.close()
                    conn = None
                now = time.monotonic()
                self.latencies.append(now - started)
                self.acked += 1
                if self._last_ok is not None:
                    self.stall = max(self.stall, now - self._last_ok)
                self._last_ok = now
            except psycopg.Error as exc:
                self.failures += 1
                if len(self.errors) < 10:
                    self.errors.append(str(exc).strip()[:300])
                if conn is not None:
                    conn.close()
                    conn = None
                time.sleep(0.05)
            time.sleep(self.pause_s)
        if conn is not None:
            conn.close()

    def start(self) -> TxWriter:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(90)

    def reset(self) -> None:
        """Count from now on (after a warm-up)."""
        self.acked, self.failures, self.stall = 0, 0, 0.0
        self.errors, self.latencies = [], []

    def wait_for(self, commits: int, timeout: float) -> bool:
        target = self.acked + commits
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.acked >= target:
                return True
            time.sleep(0.05)
        return False

    def median_latency_ms(self) -> float:
        return round(statistics.median(self.latencies) * 1000, 2) if self.latencies else 0.0

    def summary(self) -> dict[str, Any]:
        return {"committed": self.acked, "failed": self.failures, "stall_s": round(self.stall, 2),
                "median_ms": self.median_latency_ms(), "errors": self.errors[:3]}  # fmt: skip
