"""Writers that use PostgreSQL drivers at their DEFAULT settings, for the pooler's e2e test and benchmark.

psycopg 3 prepares a statement on the server after 5 executions of the same query (its default
`prepare_threshold`); asyncpg prepares every parameterised statement and keeps a cache of them (its
default `statement_cache_size`). Through a transaction-mode PgBouncer without protocol-level prepared
statements both fail (`prepared statement "_pg3_0" does not exist`, `… already exists`); nothing here
turns that off. Each writer holds one persistent connection (reopened only when it broke) and inserts
numbered rows, one autocommit transaction each, with a bound parameter, so the statement is prepared once
and then only bound and executed. It records every number the server acknowledged, so a test can check
afterwards that each acknowledged write is on the primary (`lost`).

Connections are TLS verified against the cluster's CA under the Service's name, as in pooler_load.py.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import threading
import time
from typing import Any

import asyncpg
import psycopg
from psycopg import sql

from harness.pooler_load import Endpoint

DRIVERS = ("psycopg", "asyncpg")


class _ServiceNameContext(ssl.SSLContext):
    """Verifies the server's certificate under the Service's DNS name while the socket goes to the
    Service's IP (the test runs outside the cluster and cannot resolve the name); asyncpg checks the
    certificate against the host it dials."""

    service_name = ""

    def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:
        kwargs["server_hostname"] = self.service_name
        return super().wrap_bio(*args, **kwargs)


def verify_full_context(ep: Endpoint) -> ssl.SSLContext:
    ctx = _ServiceNameContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.service_name = f"{ep.service}.{ep.namespace}.svc"
    ctx.load_verify_locations(ep.ca_file)
    ctx.check_hostname = True
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def create_table(ep: Endpoint, table: str) -> None:
    with psycopg.connect(**ep.dsn(), autocommit=True, connect_timeout=10, prepare_threshold=None) as conn:
        conn.execute(sql.SQL("create table if not exists {} (id bigint primary key, "
                             "at timestamptz default now())").format(sql.Identifier(table)))  # fmt: skip


def missing_rows(ep: Endpoint, table: str, acked: list[int]) -> list[int]:
    """The acknowledged numbers that are not in `table` (read through `ep`, best the primary's `-rw`)."""
    with psycopg.connect(**ep.dsn(), autocommit=True, connect_timeout=10, prepare_threshold=None) as conn:
        rows = conn.execute(sql.SQL("select id from {}").format(sql.Identifier(table))).fetchall()
    present = {int(r[0]) for r in rows}
    return [i for i in acked if i not in present]


class DriverWriter:
    """One driver at its defaults, inserting numbered rows into `table` through `ep` until stopped."""

    def __init__(self, driver: str, ep: Endpoint, table: str, *, pause_s: float = 0.02,
                 prepare: bool = True) -> None:  # fmt: skip
        if driver not in DRIVERS:
            raise ValueError(f"driver must be one of {DRIVERS}, not {driver!r}")
        if not re.fullmatch(r"[a-z_][a-z0-9_]{0,62}", table):
            raise ValueError(f"table must be a plain lower-case identifier, not {table!r}")
        self.driver, self.ep, self.table, self.pause_s = driver, ep, table, pause_s
        # prepare=False only for a comparison in the benchmark: psycopg with prepare_threshold=None.
        if not prepare and driver != "psycopg":
            raise ValueError("prepare=False is a psycopg setting")
        self.prepare = prepare
        self.acked: list[int] = []
        self.failures = 0
        self.errors: list[str] = []
        self.stall = 0.0  # the longest time between two acknowledged commits
        self._last_ok: float | None = None
        self._next = 1
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        create_table(ep, table)

    # Bookkeeping shared by both drivers.
    def _ok(self, number: int) -> None:
        now = time.monotonic()
        self.acked.append(number)
        if self._last_ok is not None:
            self.stall = max(self.stall, now - self._last_ok)
        self._last_ok = now

    def _failed(self, exc: BaseException) -> None:
        self.failures += 1
        if len(self.errors) < 10:
            self.errors.append(f"{type(exc).__name__}: {str(exc).strip()[:300]}")

    def _psycopg(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        insert = sql.SQL("insert into {} (id) values (%s)").format(sql.Identifier(self.table))
        while not self._stop.is_set():
            number, self._next = self._next, self._next + 1
            try:
                if conn is None:
                    # No prepare_threshold: the driver's default (prepare after 5 executions).
                    off: dict[str, Any] = {} if self.prepare else {"prepare_threshold": None}
                    conn = psycopg.connect(**self.ep.dsn(), autocommit=True, connect_timeout=60,
                                           tcp_user_timeout=60000, **off)  # fmt: skip
                conn.execute(insert, (number,))
                self._ok(number)
            except psycopg.Error as exc:
                self._failed(exc)
                if conn is not None:
                    conn.close()
                    conn = None
                time.sleep(0.05)
            if self.pause_s:
                time.sleep(self.pause_s)
        if conn is not None:
            conn.close()

    async def _asyncpg(self) -> None:
        conn: asyncpg.Connection | None = None
        insert = f'insert into "{self.table}" (id) values ($1)'  # noqa: S608 - checked identifier
        tls = verify_full_context(self.ep)
        while not self._stop.is_set():
            number, self._next = self._next, self._next + 1
            try:
                if conn is None:
                    # asyncpg's defaults: every statement prepared, a cache of 100 of them.
                    conn = await asyncpg.connect(host=self.ep.ip, port=5432, user=self.ep.user,
                                                 password=self.ep.password, database=self.ep.dbname,
                                                 ssl=tls, timeout=60)  # fmt: skip
                await conn.execute(insert, number)
                self._ok(number)
            except (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError) as exc:
                self._failed(exc)
                if conn is not None:
                    conn.terminate()
                    conn = None
                await asyncio.sleep(0.05)
            if self.pause_s:
                await asyncio.sleep(self.pause_s)
        if conn is not None:
            await conn.close(timeout=10)

    def _run(self) -> None:
        if self.driver == "psycopg":
            self._psycopg()
        else:
            asyncio.run(self._asyncpg())

    def start(self) -> DriverWriter:
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"writer-{self.driver}")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(90)

    def reset(self) -> None:
        """Count failures and stalls from now on (after a warm-up); acknowledged rows are kept."""
        self.failures, self.stall, self.errors = 0, 0.0, []

    def wait_for(self, commits: int, timeout: float) -> bool:
        target = len(self.acked) + commits
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(self.acked) >= target:
                return True
            time.sleep(0.05)
        return False

    def summary(self) -> dict[str, Any]:
        return {"driver": self.driver, "committed": len(self.acked), "failed": self.failures,
                "stall_s": round(self.stall, 2), "errors": self.errors[:3]}  # fmt: skip
