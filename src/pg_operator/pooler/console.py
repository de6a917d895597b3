"""PgBouncer's admin console over its Unix socket: the PostgreSQL wire protocol's simple query flow, the
only one the console speaks (no driver needed; PgBouncer lets the user `pgbouncer` in without a password
over the socket when the peer runs under PgBouncer's own uid, which the supervisor and the commands the
operator execs do).

`encode_*` and `parse_*` are pure (tested with bytes); `Console` does the I/O.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from dataclasses import dataclass, field

PROTOCOL_VERSION = 196608  # 3.0
ADMIN_USER = "pgbouncer"
ADMIN_DATABASE = "pgbouncer"

Row = dict[str, str | None]


class ConsoleError(Exception):
    """PgBouncer answered with an error, or the connection failed."""


def encode_startup(user: str, database: str) -> bytes:
    body = struct.pack("!I", PROTOCOL_VERSION)
    for k, v in (("user", user), ("database", database)):
        body += k.encode() + b"\0" + v.encode() + b"\0"
    body += b"\0"
    return struct.pack("!I", len(body) + 4) + body


def encode_query(sql: str) -> bytes:
    payload = sql.encode() + b"\0"
    return b"Q" + struct.pack("!I", len(payload) + 4) + payload


def split_messages(buffer: bytes) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """Whole (type, payload) messages at the start of `buffer`, and what is left after them."""
    out = []
    at = 0
    while len(buffer) - at >= 5:
        kind = buffer[at : at + 1]
        (length,) = struct.unpack("!I", buffer[at + 1 : at + 5])
        if len(buffer) - at - 1 < length:
            break
        out.append((kind, buffer[at + 5 : at + 1 + length]))
        at += 1 + length
    return out, buffer[at:]


def parse_error(payload: bytes) -> str:
    fields = {}
    for part in payload.split(b"\0"):
        if part:
            fields[part[:1]] = part[1:].decode(errors="replace")
    return fields.get(b"M", "unknown error")


def parse_row_description(payload: bytes) -> list[str]:
    (count,) = struct.unpack("!H", payload[:2])
    names, at = [], 2
    for _ in range(count):
        end = payload.index(b"\0", at)
        names.append(payload[at:end].decode())
        at = end + 1 + 18  # table oid, column, type oid, size, modifier, format
    return names


def parse_data_row(payload: bytes) -> list[str | None]:
    (count,) = struct.unpack("!H", payload[:2])
    values: list[str | None] = []
    at = 2
    for _ in range(count):
        (length,) = struct.unpack("!i", payload[at : at + 4])
        at += 4
        if length < 0:
            values.append(None)
        else:
            values.append(payload[at : at + length].decode(errors="replace"))
            at += length
    return values


@dataclass
class Result:
    rows: list[Row] = field(default_factory=list)
    command: str = ""
    error: str | None = None


def collect(messages: list[tuple[bytes, bytes]], result: Result, columns: list[str]) -> bool:
    """Fold messages into `result`; True once ReadyForQuery came."""
    for kind, payload in messages:
        if kind == b"T":
            columns[:] = parse_row_description(payload)
        elif kind == b"D":
            result.rows.append(dict(zip(columns, parse_data_row(payload), strict=False)))
        elif kind == b"C":
            result.command = payload.rstrip(b"\0").decode(errors="replace")
        elif kind == b"E":
            result.error = parse_error(payload)
        elif kind == b"Z":
            return True
    return False


class Console:
    """One admin-console session. `timeout` bounds each read (a PAUSE waits for running transactions)."""

    def __init__(self, socket_path: str, timeout: float = 10.0) -> None:
        self.path = socket_path
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._buffer = b""

    def __enter__(self) -> Console:
        self.connect()
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
            sock.sendall(encode_startup(ADMIN_USER, ADMIN_DATABASE))
        except OSError as exc:
            sock.close()
            raise ConsoleError(f"cannot reach PgBouncer's console at {self.path}: {exc}") from exc
        self._sock = sock
        startup = self._until_ready()
        if startup.error:
            self.close()
            raise ConsoleError(f"PgBouncer's console refused the login: {startup.error}")

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.sendall(b"X\0\0\0\4")
            self._sock.close()
            self._sock = None

    def _until_ready(self) -> Result:
        assert self._sock is not None
        result, columns = Result(), list[str]()
        while True:
            try:
                chunk = self._sock.recv(65536)
            except OSError as exc:  # a timeout too
                raise ConsoleError(f"PgBouncer's console did not answer: {exc}") from exc
            if not chunk:
                raise ConsoleError("PgBouncer closed the console connection")
            messages, self._buffer = split_messages(self._buffer + chunk)
            for kind, payload in messages:
                if kind == b"R" and struct.unpack("!I", payload[:4])[0] != 0:
                    raise ConsoleError("PgBouncer's console asked for a password")
            if collect(messages, result, columns):
                return result

    def query(self, sql: str) -> Result:
        if self._sock is None:
            raise ConsoleError("not connected")
        try:
            self._sock.sendall(encode_query(sql))
        except OSError as exc:
            raise ConsoleError(f"PgBouncer's console: {exc}") from exc
        return self._until_ready()

    def run(self, sql: str) -> list[Row]:
        """A command that must succeed; its rows."""
        result = self.query(sql)
        if result.error:
            raise ConsoleError(f"{sql}: {result.error}")
        return result.rows
