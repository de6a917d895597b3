"""Runs the tenant's queries (metrics_custom.py) on the /metrics connection (or one like it to the database a
query names, kept between scrapes): the file read again when it changes, each query in a read-only
transaction that is always rolled back (so nothing a query sets, such as a session setting through
set_config, outlives it), with the built-in set's statement timeout cut to what is left of the scrape's
budget, at most MAX_ROWS rows. A failing query costs its own samples and one count in
pgop_custom_query_errors_total, never the scrape.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import sql

from pg_operator.instance import metrics_custom as mc
from pg_operator.instance.metrics import Family

Connection = psycopg.Connection[Any]
Connect = Callable[[str], Connection]  # opens a connection like the built-in set's to a database


def _log(message: str) -> None:
    print(f"pg-operator-instance metrics: {message}", file=sys.stderr, flush=True)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class CustomQueries:
    """The queries of one file, loaded again when its content changes; their error counts."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.queries: list[mc.CustomQuery] = []
        self.invalid = False
        self.errors: dict[str, int] = {}
        self._content: bytes | None = None
        self._last_error: dict[str, str] = {}
        # Kept connections to the databases the queries name besides the built-in set's (`postgres`).
        self._others: dict[str, psycopg.Connection[Any]] = {}

    def _read_file(self) -> bytes | None:
        if self.path is None:
            return None
        try:
            with open(self.path, "rb") as f:
                # One byte over the bound is enough to refuse it.
                return f.read(mc.MAX_FILE_BYTES + 1)
        except FileNotFoundError:
            return None  # the ConfigMap or key does not exist (yet): the built-in set alone
        except OSError as e:
            return f"# unreadable: {e.strerror}".encode()

    def load(self) -> None:
        content = self._read_file()
        if content == self._content:
            return
        self._content = content
        try:
            self.queries = mc.parse(content or b"")
            self.invalid = False
            _log(f"custom queries: {len(self.queries)} loaded")
        except mc.QueriesRefused as e:
            self.queries, self.invalid = [], True
            _log(f"custom queries refused: {e}")

    def own_families(self) -> list[Family]:
        if self.path is None:
            return []
        return mc.own_families(self.invalid, len(self.queries), self.errors)

    def close(self) -> None:
        for other in self._others.values():
            other.close()
        self._others.clear()

    def _connection(self, main: Connection, database: str, connect: Connect) -> Connection:
        if database == mc.DEFAULT_DATABASE:
            conn = main
        else:
            conn = self._others.get(database) or connect(database)
            self._others[database] = conn
        if conn.closed:
            self._others.pop(database, None)
            raise psycopg.OperationalError("the connection was lost")
        return conn

    def collect(self, conn: Connection, *, in_recovery: bool, deadline: float, timeout_ms: int,
                counter: list[int], connect: Connect) -> list[Family]:  # fmt: skip
        """The samples of every query that ran; `conn` is the built-in set's connection (database
        postgres), `connect` opens one like it to another database, `timeout_ms` is its statement
        timeout."""
        self.load()
        for name in set(self._others) - {q.database for q in self.queries}:
            self._others.pop(name).close()  # a database no query names any more
        out: list[Family] = []
        for query in self.queries:
            if query.primary_only and in_recovery:
                continue
            try:
                target = self._connection(conn, query.database, connect)
                remaining_ms = int((deadline - time.monotonic()) * 1000)
                if remaining_ms <= 0:
                    raise TimeoutError("the scrape's time budget is spent")
                counter[0] += 1
                out += mc.samples(query, self._rows(target, query, min(timeout_ms, remaining_ms)))
            except (psycopg.Error, ValueError, TimeoutError) as e:
                self._failed(query.prefix, _first_line(e))
                broken = self._others.get(query.database)
                if broken is not None and broken.closed:
                    self._others.pop(query.database)
            else:
                if self._last_error.pop(query.prefix, None):
                    _log(f"custom query {query.prefix}: runs again")
        return out

    def _rows(self, conn: psycopg.Connection[Any], query: mc.CustomQuery, timeout_ms: int) -> list[Any]:
        with conn.transaction(force_rollback=True):
            conn.execute("SET TRANSACTION READ ONLY")
            conn.execute(sql.SQL("SET LOCAL statement_timeout = {}").format(sql.Literal(timeout_ms)))
            rows = conn.execute(query.sql).fetchmany(mc.MAX_ROWS + 1)
        if len(rows) > mc.MAX_ROWS:
            raise ValueError(f"the query returned more than {mc.MAX_ROWS} rows")
        return rows

    def _failed(self, name: str, message: str) -> None:
        self.errors[name] = self.errors.get(name, 0) + 1
        if self._last_error.get(name) != message:
            _log(f"custom query {name} failed: {message}")
        self._last_error[name] = message
